"""One engine in a Ray actor: the engine plugin the run names, resolved from the worker's own environment
and started on the actor's event loop, answering the engine protocol's calls for the driver's pool.

The actor hosts any engine plugin: the ``embedded`` engine on a CPU node, or an engine that launches an
SGLang server on the GPUs Ray gave the actor. What differs per engine kind is only the resources the
actor asks for (:func:`actor_resources`). For SGLang engines that leaves: a free port per actor before
the engine is built (``args.sglang_router_port``, reported back in ``start()``'s ``url``), placement groups
for engines over several GPUs (slime's ``--rollout-num-gpus-per-engine``), and weights from disk on a
filesystem every node sees (the pool forwards ``update_weights_from_disk`` to each actor)."""

from __future__ import annotations

import time
from typing import Any

from .cluster import worker_info


def actor_resources(args: Any) -> dict[str, Any]:
    """The Ray resources of one engine actor: ``ray_engine_cpus`` CPUs, and ``rollout_num_gpus_per_engine``
    GPUs for an engine on CUDA."""
    resources: dict[str, Any] = {"num_cpus": args.ray_engine_cpus}
    if args.engine_device.startswith("cuda"):
        resources["num_gpus"] = getattr(args, "rollout_num_gpus_per_engine", 1) or 1
    return resources


def actor_device(args: Any) -> str:
    return args.engine_device


class EngineActor:
    """A Ray actor holding one engine (an async actor: its calls run on the actor's event loop).

    Started in two calls: :meth:`prepare` builds the engine object (its plugin's imports: torch,
    transformers) and runs the engine's own optional ``prepare()`` (all of its start but the weights), and
    :meth:`start` starts it. A *standby* actor is one prepared and not started: the pool keeps one ready, so
    that a dead engine's replacement only loads weights."""

    def __init__(self, args: Any, index: int) -> None:
        self.args = args
        self.index = index
        self.engine: Any = None
        self._built: Any = None
        self.created_at = time.time()

    async def where(self) -> dict[str, Any]:
        """Node, process, log file and installed plugins of this actor (see :func:`worker_info`), and when
        the actor was created in its process (``time.time()``)."""
        return {**worker_info(), "created_at": self.created_at}

    async def prepare(self) -> float:
        """Resolve the engine plugin here and build the engine without starting it; ``time.time()`` then."""
        if self._built is None:
            from ..plugins.manager import get_plugin_manager
            from ..rollout.job import engine_name

            built = get_plugin_manager().resolve("engine", engine_name(self.args)).func(self.args)
            prepare = getattr(built, "prepare", None)
            if prepare is not None:
                await prepare()
            self._built = built
        return time.time()

    async def start(self) -> dict[str, Any]:
        """Start the engine (prepared first if it was not); what the pool needs to know of it, with
        ``time.time()`` once it was prepared and once it started."""
        prepared_at = await self.prepare()
        engine = self._built
        await engine.start()
        self.engine = engine
        model_path = getattr(engine, "model_path", None)
        return {
            "in_process_weights": engine.in_process_weights,
            "url": engine.url,
            "model_path": str(model_path) if model_path else None,
            "prepared_at": prepared_at,
            "started_at": time.time(),
        }

    async def ping(self) -> bool:
        return self.engine is not None

    async def generate(self, payload: dict[str, Any]) -> Any:
        return await self.engine.generate(payload)

    async def abort(self, rid: str | None = None) -> None:
        await self.engine.abort(rid)

    async def load(self) -> dict[str, int]:
        return await self.engine.load()

    async def model_info(self) -> dict[str, Any]:
        return await self.engine.model_info()

    async def pause(self, mode: str) -> None:
        await self.engine.pause(mode)

    async def resume(self) -> None:
        await self.engine.resume()

    async def flush_cache(self) -> bool:
        return await self.engine.flush_cache()

    async def update_weights(self, shared: Any, weight_version: str | None) -> None:
        """Take the weights (Ray resolved the driver's object reference here to the arrays of
        :func:`.weights.to_shared`, mapped from the object store)."""
        from .weights import from_shared

        await self.engine.update_weights(from_shared(shared), weight_version)

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None) -> None:
        await self.engine.update_weights_from_disk(model_path, weight_version)

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.close()
