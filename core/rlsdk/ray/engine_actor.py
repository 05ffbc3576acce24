"""One engine in a Ray actor: the engine plugin the run names, resolved from the worker's own environment
and started on the actor's event loop, answering the engine protocol's calls for the driver's pool.

The actor hosts any engine plugin: the ``embedded`` engine on a CPU node, or an engine that launches servers
on the GPUs Ray gave the actor (its record's ``launches``: the ``sglang`` engine, the ``vllm`` engine). For
those, :func:`engine_args` turns the run's options into one engine's: one server
(``rollout_num_gpus_per_engine`` GPUs, GPU 0 of those Ray set in ``CUDA_VISIBLE_DEVICES``), seed
``rollout_seed + index``, and for SGLang a free port of the node and the log ``logs/sglang-server-<index>.log``;
the actor reports its URL from ``start()``. Its health answer is the server's (:meth:`EngineActor.health`),
so a server that dies in a live actor is a dead engine to the pool; an actor that dies takes its server with
it (the server is started from the actor's event-loop thread, which lives as long as the actor's process, so
its parent-death signal comes when the process dies).
Weights reach it from disk (the pool forwards ``update_weights_from_disk``): the folder must be on a
filesystem every node sees."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..engines.launch.process_group import free_port
from ..errors import RlsdkError
from ..plugins.calls import call_engine
from ..plugins.manager import get_plugin_manager
from .cluster import import_ray, worker_info
from ..plugins.kinds import Engine
from ..config import RolloutConfig

T = TypeVar("T")


class EngineDiedError(RlsdkError):
    """A request failed because the actor's engine is down (its server exited, or fails its health check)."""


def launches_servers(args: RolloutConfig) -> bool:
    """Whether the run's engine starts servers of its own on GPUs (its record's ``launches``: the ``sglang``
    engine without a URL, say), resolved from this process's plugins."""
    record = get_plugin_manager().resolve(Engine.kind, Engine.chosen(args)).record
    launches = getattr(record, "launches", None)
    return bool(launches is not None and launches(args))


def engine_count(args: RolloutConfig) -> int:
    """The run's serving engines: ``num_engines``; for engines launching servers on GPUs,
    ``rollout_num_gpus // rollout_num_gpus_per_engine`` (a ``num_engines`` other than 1 must agree)."""
    if not launches_servers(args):
        return args.num_engines
    per_engine = args.rollout_num_gpus_per_engine
    total = args.rollout_num_gpus or per_engine
    if per_engine < 1 or total < per_engine or total % per_engine:
        raise ValueError(
            f"--rollout-num-gpus ({total}) must be a positive multiple of "
            f"--rollout-num-gpus-per-engine ({per_engine})"
        )
    if args.colocate:
        raise ValueError(
            f"--colocate is not supported with --ray: {Engine.chosen(args)} engine actors hold their own GPUs"
        )
    count = total // per_engine
    if args.num_engines not in (1, count):
        raise ValueError(
            f"--num-engines {args.num_engines} disagrees with --rollout-num-gpus {total} / "
            f"--rollout-num-gpus-per-engine {per_engine} = {count} {Engine.chosen(args)} engines: leave "
            f"--num-engines out, or pass --rollout-num-gpus {args.num_engines * per_engine}"
        )
    return count


def standby_count(args: RolloutConfig) -> int:
    """``ray_standby_engines``; by default one, none for engines launching servers on GPUs (a standby holds
    its GPUs)."""
    if args.ray_standby_engines is not None:
        return args.ray_standby_engines
    return 0 if launches_servers(args) else 1


def engine_args(args: RolloutConfig, index: int) -> Any:
    """The options engine actor ``index`` builds its engine from: the run's, except for an engine that
    launches servers, which launches one on the actor's GPUs (numbered from 0: Ray sets
    ``CUDA_VISIBLE_DEVICES``; the trainer's are elsewhere) with the seed of engine ``index`` (and for SGLang
    a free port of this node and its log). Called in the actor."""
    if not launches_servers(args):
        return args

    host = import_ray().util.get_node_ip_address()
    return dataclasses.replace(
        args,
        rollout_num_gpus=args.rollout_num_gpus_per_engine,
        rollout_engine_index=index,
        sglang_router_ip=host,
        sglang_router_port=free_port(host),
        sglang_launch=True,
        train=False,
    )


def actor_resources(args: RolloutConfig) -> dict[str, Any]:
    """The Ray resources of one engine actor: ``ray_engine_cpus`` CPUs, and ``rollout_num_gpus_per_engine``
    GPUs for an engine on CUDA (an SGLang engine is)."""
    resources: dict[str, Any] = {"num_cpus": args.ray_engine_cpus}
    if launches_servers(args) or engine_device(args).startswith("cuda"):
        resources["num_gpus"] = getattr(args, "rollout_num_gpus_per_engine", 1) or 1
    return resources


def engine_device(args: RolloutConfig) -> str:
    """The embedded engine's ``engine_device`` option (its plugin declares it): the device an engine actor
    asks Ray for."""
    return str(getattr(args, "engine_device", None) or "cpu")


def actor_device(args: RolloutConfig) -> str:
    return "cuda" if launches_servers(args) else engine_device(args)


class EngineActor:
    """A Ray actor holding one engine (an async actor: its calls run on the actor's event loop).

    Started in two calls: :meth:`prepare` builds the engine object (its plugin's imports: torch,
    transformers) and runs the engine's own optional ``prepare()`` (all of its start but the weights), and
    :meth:`start` starts it. A *standby* actor is one prepared and not started: the pool keeps one ready, so
    that a dead engine's replacement only loads weights."""

    def __init__(self, args: RolloutConfig, index: int) -> None:
        self.args = args
        self.index = index
        self.engine: Any = None
        self._built: Any = None
        self.created_at = time.time()
        self.answered_at = 0.0
        """``time.monotonic()`` when the engine last answered a request."""

    async def where(self) -> dict[str, Any]:
        """Node, process, log file and installed plugins of this actor (see :func:`worker_info`), and when
        the actor was created in its process (``time.time()``)."""
        return {**worker_info(), "created_at": self.created_at}

    async def prepare(self) -> float:
        """Resolve the engine plugin here and build the engine without starting it; ``time.time()`` then."""
        if self._built is None:
            # engine: this worker's own plugin, built through the engine call point
            a = engine_args(self.args, self.index)
            built = call_engine(get_plugin_manager().resolve(Engine.kind, Engine.chosen(a)), a)
            prepare = getattr(built, "prepare", None)
            if prepare is not None:
                await prepare()
            self._built = built
        return time.time()

    async def start(self, index: int) -> dict[str, Any]:
        """Start the engine as engine ``index`` (prepared first if it was not, or again when a standby
        launching SGLang takes another index); what the pool needs to know of it, with ``time.time()`` once
        it was prepared and once it started."""
        if index != self.index and self.engine is None:
            self.index = index
            if launches_servers(self.args):
                self._built = None
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

    async def health(self) -> str | None:
        """None while the engine is healthy; else what is wrong: not started, or the engine's own
        ``health_problem(timeout=...)`` within ``rollout_health_check_timeout`` (an SGLang engine's: a
        launched server exited, or ``/health`` fails). An engine that answered requests while its check
        failed is busy, not hung: healthy (a server with a thousand requests in flight can answer
        ``/health`` late)."""
        if self.engine is None:
            return "its engine is not started"
        problem = getattr(self.engine, "health_problem", None)
        if problem is None:
            return None
        asked = time.monotonic()
        found: str | None = await problem(timeout=self.args.rollout_health_check_timeout)
        return None if found is not None and self.answered_at > asked else found

    async def _call(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``'s result; a failure while the engine is down is an :class:`EngineDiedError`, which the
        pool takes as the engine's death (a request comes back aborted, not failed; a sync goes on
        without it)."""
        try:
            return await call()
        except Exception as exc:
            problem = await self.health()
            if problem is not None:
                raise EngineDiedError(problem) from exc
            raise

    async def generate(self, payload: dict[str, Any]) -> Any:
        answer = await self._call(lambda: self.engine.generate(payload))
        self.answered_at = time.monotonic()
        return answer

    async def abort(self, rid: str | None = None) -> None:
        await self._call(lambda: self.engine.abort(rid))

    async def load(self) -> dict[str, int]:
        return await self._call(lambda: self.engine.load())

    async def model_info(self) -> dict[str, Any]:
        return await self._call(lambda: self.engine.model_info())

    async def pause(self, mode: str) -> None:
        await self._call(lambda: self.engine.pause(mode))

    async def resume(self) -> None:
        await self._call(lambda: self.engine.resume())

    async def flush_cache(self) -> bool:
        return await self._call(lambda: self.engine.flush_cache())

    async def weight_checksums(self) -> Any:
        return await self._call(lambda: self.engine.weight_checksums())

    async def update_weights(self, shared: Any, weight_version: str | None) -> None:
        """Take the weights (Ray resolved the driver's object reference here to the arrays of
        :func:`.weights.to_shared`, mapped from the object store)."""
        from .weights import from_shared

        await self._call(lambda: self.engine.update_weights(from_shared(shared), weight_version))

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None) -> None:
        await self._call(lambda: self.engine.update_weights_from_disk(model_path, weight_version))

    async def pull_weights(self, pull: Any, weight_version: str | None) -> None:
        """A delta version, applied to this host's local checkpoint, then reloaded."""
        await self._call(lambda: self.engine.pull_weights(pull, weight_version))

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.close()


def local_cpus(args: RolloutConfig) -> int:
    """Logical CPUs of a local cluster: the machine's, or what the engines (spares and standbys included),
    the trainer and one grading task ask for when that is more (each engine and the trainer set their own
    torch threads: Ray's count only places actors)."""
    actors = engine_count(args) + args.ray_spare_engines + standby_count(args)
    engines = int(actors * args.ray_engine_cpus + 0.999)
    return max(os.cpu_count() or 1, engines + 2)
