"""Engines as Ray actors behind one engine: least-loaded routing, and engines that die survived.

:class:`RayEnginePool` is the run's engine when ``--ray`` is on, so the rollout step, the generators and the
weight sync use it as they use one engine. Each request goes to the live engine with the fewest requests
in flight. An engine that dies (its actor killed, its process SIGKILLed, or silent to health checks) is
noticed by its requests failing, at once, or by the next health check; each of its requests in flight
then comes back as an *aborted* response with no tokens, so the rollout step returns its group to the
buffer, as it returns any aborted group: the ledger balances and nothing is lost. The engine is started
again, given the current weights, checked against the last trust probe, and rejoins.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ..engines.engine import InferenceEngine
from ..engines.protocol import finish_abort, generate_response, new_rid, split_batch
from ..errors import RlsdkError
from .cluster import ActorStartError, describe_place, first_line, import_ray, place, start
from .engine_actor import EngineActor, actor_device, actor_resources
from .environments import check_worker

log = logging.getLogger(__name__)

HEALTH_INTERVAL = 1.0
"""Seconds between health checks of each live engine."""
HEALTH_TIMEOUT = 30.0
"""An engine that does not answer a health check within this many seconds is taken for dead (hung)."""
MAX_RESTARTS = 3
"""Attempts to start a dead engine again before the run stops."""


class EngineLostError(RlsdkError):
    """A dead engine could not be brought back."""


@dataclass
class Recovery:
    """One dead engine brought back: when it was found dead and when it rejoined (``time.time()``)."""

    engine: int
    detected_at: float
    cause: str
    rejoined_at: float | None = None
    by_spare: bool = False
    """A spare engine took its place (else a new one was started)."""


@dataclass(eq=False)
class Replica(InferenceEngine):
    """One engine actor seen from the driver, as an engine (the trust check probes each)."""

    index: int
    actor: Any = None
    info: dict[str, Any] = field(default_factory=dict)
    place_text: str = ""
    alive: bool = False
    in_flight: int = 0
    sent: int = 0

    @property
    def name(self) -> str:
        return f"engine {self.index} ({self.place_text})"

    async def generate(self, payload: dict[str, Any]) -> Any:
        return await self.actor.generate.remote(payload)

    async def abort(self, rid: str | None = None) -> None:
        await self.actor.abort.remote(rid)

    async def model_info(self) -> dict[str, Any]:
        return await self.actor.model_info.remote()


class RayEnginePool(InferenceEngine):
    """``args.num_engines`` actors of the engine plugin ``engine_spec`` (a name the actors resolve)."""

    def __init__(self, args: Any, engine_spec: str, driver_plugins: dict[str, str | None]) -> None:
        self.args = args
        self.engine_spec = engine_spec
        self.driver_plugins = driver_plugins
        self.replicas_ = [Replica(index=i) for i in range(args.num_engines)]
        self.recoveries: list[Recovery] = []
        self.model_path: str | None = None
        self._weights: tuple[str, Any, str | None] | None = None
        """The weights the engines serve since the last sync: ("state", object ref, version) or ("disk",
        folder, version); None before the first sync."""
        self._probe: Any = None
        """The TrustProbe the engines passed with those weights (None while a sync is under way)."""
        self._sync_lock = asyncio.Lock()
        self._changed = asyncio.Condition()
        self._failure: BaseException | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._rids: dict[str, Replica] = {}
        self._spares: list[Replica] = []
        """Engines started beside the serving ones (``ray_spare_engines``), each ready to take the place of
        one that dies."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        spares = [Replica(index=-1) for _ in range(self.args.ray_spare_engines)]
        results = await asyncio.gather(
            *(self._start_actor(r) for r in self.replicas_),
            *(self._start_actor(s, "a spare engine") for s in spares),
            return_exceptions=True,
        )
        self._spares = spares
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            await self.close()
            raise failed[0]
        first = self.replicas_[0].info
        self.in_process_weights = bool(first["engine"]["in_process_weights"])
        self.model_path = first["engine"]["model_path"]
        for replica in self.replicas_:
            replica.alive = True
        self._spawn(self._health_checks())

    async def _start_actor(self, replica: Replica, what: str | None = None) -> None:
        """Create, place, check and start one engine actor within ``ray_start_timeout`` each."""
        ray = import_ray()
        args, what = self.args, what or f"engine {replica.index}"
        resources = actor_resources(args)
        actor = (
            ray.remote(EngineActor)
            .options(max_concurrency=1000, max_restarts=0, **resources)
            .remote(args, replica.index)
        )
        info = await place(actor, actor.where.remote(), what, resources, args.ray_start_timeout)
        port = None
        place_text = describe_place(info, device=actor_device(args), port=port)
        try:
            check_worker(what, info, self.driver_plugins)  # plugins differ: stop before the first step
        except RlsdkError:
            ray.kill(actor)
            raise
        engine = await start(actor, what, place_text, actor.start.remote(), args.ray_start_timeout)
        if engine.get("url"):
            from urllib.parse import urlparse

            place_text = describe_place(info, device=actor_device(args), port=urlparse(engine["url"]).port)
        replica.actor, replica.info, replica.place_text = actor, {**info, "engine": engine}, place_text

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        ray = import_ray()
        for replica in [*self.replicas_, *self._spares]:
            if replica.actor is not None:
                try:
                    await asyncio.wait_for(replica.actor.close.remote(), 10)
                except (ray.exceptions.RayError, TimeoutError):
                    pass
                ray.kill(replica.actor)
            replica.alive = False

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ routing

    def replicas(self) -> list[InferenceEngine]:
        return [r for r in self.replicas_ if r.alive]

    async def _pick(self) -> Replica:
        """The live engine with the fewest requests in flight (then the fewest sent); waits while none is
        alive, for one to rejoin."""
        live = [r for r in self.replicas_ if r.alive]
        if live and self._failure is None:
            return min(live, key=lambda r: (r.in_flight, r.sent))
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: self._failure or any(r.alive for r in self.replicas_)),
                self.args.ray_start_timeout * MAX_RESTARTS,
            )
        if self._failure is not None:
            raise self._failure
        return min((r for r in self.replicas_ if r.alive), key=lambda r: (r.in_flight, r.sent))

    async def generate(self, payload: dict[str, Any]) -> Any:
        ray = import_ray()
        replica = await self._pick()
        actor = replica.actor
        replica.in_flight += 1
        replica.sent += 1
        rid = payload.get("rid") if isinstance(payload.get("rid"), str) else None
        if rid:
            self._rids[rid] = replica
        try:
            return await actor.generate.remote(payload)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            self._lost(replica, actor, f"its actor died: {first_line(exc)}")
            return aborted(payload, f"{replica.name} died mid-request")
        finally:
            replica.in_flight -= 1
            if rid:
                self._rids.pop(rid, None)

    async def abort(self, rid: str | None = None) -> None:
        if rid is not None:
            replica = self._rids.get(rid)
            targets = [replica] if replica is not None and replica.alive else []
        else:
            targets = [r for r in self.replicas_ if r.alive]
        await self._on_each(targets, "abort", rid)

    async def load(self) -> dict[str, int]:
        loads = await self._on_each([r for r in self.replicas_ if r.alive], "load")
        return {key: sum(load[key] for load in loads) for key in ("num_running_reqs", "num_waiting_reqs")}

    async def model_info(self) -> dict[str, Any]:
        replica = await self._pick()
        info = await replica.actor.model_info.remote()
        return {**info, "num_engines": len(self.replicas_)}

    async def pause(self, mode: str = "abort") -> None:
        await self._on_each([r for r in self.replicas_ if r.alive], "pause", mode)

    async def resume(self) -> None:
        await self._on_each([r for r in self.replicas_ if r.alive], "resume")

    async def flush_cache(self) -> bool:
        return all(await self._on_each([r for r in self.replicas_ if r.alive], "flush_cache"))

    async def _on_each(self, replicas: list[Replica], method: str, *args: Any) -> list[Any]:
        """Call ``method`` on each engine; an engine that died meanwhile is left to its restart."""
        ray = import_ray()
        actors = [r.actor for r in replicas]
        results = await asyncio.gather(
            *(getattr(a, method).remote(*args) for a in actors), return_exceptions=True
        )
        answered = []
        for replica, actor, result in zip(replicas, actors, results, strict=True):
            if isinstance(result, (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)):
                self._lost(replica, actor, f"its actor died: {first_line(result)}")
            elif isinstance(result, BaseException):
                raise result
            else:
                answered.append(result)
        return answered

    # ------------------------------------------------------------------ weights

    async def update_weights(self, state_dict: Any, weight_version: str | None = None) -> None:
        """Put the weights in Ray's object store once (unless they are there already, as a remote trainer's
        are) and have every live engine take them; a restarted engine takes the same ones."""
        ray = import_ray()
        ref = (
            state_dict
            if isinstance(state_dict, ray.ObjectRef)
            else await asyncio.to_thread(ray.put, dict(state_dict))
        )
        async with self._sync_lock:
            self._weights, self._probe = ("state", ref, weight_version), None
            await self._on_each([r for r in self.replicas_ if r.alive], "update_weights", ref, weight_version)

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> None:
        async with self._sync_lock:
            self._weights, self._probe = ("disk", model_path, weight_version), None
            await self._on_each(
                [r for r in self.replicas_ if r.alive], "update_weights_from_disk", model_path, weight_version
            )

    def remember_trust_probe(self, probe: Any) -> None:
        self._probe = probe
        self._spawn(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------------ failures

    def _lost(self, replica: Replica, actor: Any, cause: str) -> None:
        """Take a dead engine out of the routing (once per actor) and start bringing it back."""
        if not replica.alive or replica.actor is not actor:
            return
        replica.alive = False
        recovery = Recovery(engine=replica.index, detected_at=time.time(), cause=cause)
        self.recoveries.append(recovery)
        log.warning("%s is lost (%s); restarting it", replica.name, cause)
        import_ray().kill(replica.actor)  # a hung actor: its requests in flight fail now
        self._spawn(self._recover(replica, recovery))

    async def _recover(self, replica: Replica, recovery: Recovery) -> None:
        """Start the engine again, give it the current weights, check it, let it rejoin; after
        :data:`MAX_RESTARTS` failed attempts the run stops."""
        ray = import_ray()
        error: BaseException | None = None
        for _ in range(MAX_RESTARTS):
            try:
                if self._spares:  # a started spare takes its place; another spare starts meanwhile
                    spare = self._spares.pop(0)
                    replica.actor, replica.info, replica.place_text = (
                        spare.actor,
                        spare.info,
                        spare.place_text,
                    )
                    recovery.by_spare = True
                    self._spawn(self._add_spare())
                else:
                    recovery.by_spare = False
                    await self._start_actor(replica)
                async with self._sync_lock:
                    await self._catch_up(replica)
                    replica.alive = True
                recovery.rejoined_at = time.time()
                log.warning(
                    "%s rejoined %.1fs after it was lost",
                    replica.name,
                    recovery.rejoined_at - recovery.detected_at,
                )
                await self._notify()
                return
            except asyncio.CancelledError:
                raise
            except (ActorStartError, ray.exceptions.RayActorError) as exc:  # try again with a fresh actor
                error = exc
            except Exception as exc:  # noqa: BLE001 - a failed trust check or weight load: not to be trusted
                error = exc
                break
        self._failure = EngineLostError(
            f"engine {replica.index} could not be brought back after it died ({recovery.cause}): {error}"
        )
        await self._notify()

    async def _add_spare(self) -> None:
        spare = Replica(index=-1)
        try:
            await self._start_actor(spare, "a spare engine")
        except ActorStartError as exc:
            log.warning("no spare engine: %s", exc)
            return
        self._spares.append(spare)

    async def _catch_up(self, replica: Replica) -> None:
        """Give a restarted engine the weights the others serve, and check it against their trust probe
        (waiting, while a sync is under way, for the probe of the weights it took)."""
        if self._weights is None:
            return  # no sync yet: it loaded the starting weights, as the others did
        kind, value, version = self._weights
        method = replica.actor.update_weights if kind == "state" else replica.actor.update_weights_from_disk
        await method.remote(value, version)
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: self._probe is not None), HEALTH_TIMEOUT)
        await self._probe.check(replica)

    async def _health_checks(self) -> None:
        """Ping every live engine each :data:`HEALTH_INTERVAL`; a dead or silent one is lost."""
        ray = import_ray()
        while True:
            await asyncio.sleep(HEALTH_INTERVAL)
            live = [(r, r.actor) for r in self.replicas_ if r.alive]
            pings = [asyncio.wait_for(_await(actor.ping.remote()), HEALTH_TIMEOUT) for _, actor in live]
            results = await asyncio.gather(*pings, return_exceptions=True)
            for (replica, actor), result in zip(live, results, strict=True):
                if isinstance(result, TimeoutError):
                    self._lost(replica, actor, f"no answer to a health check within {HEALTH_TIMEOUT:g}s")
                elif isinstance(result, ray.exceptions.RayError):
                    self._lost(replica, actor, f"its actor died: {first_line(result)}")


async def _await(ref: Any) -> Any:
    return await ref


def aborted(payload: dict[str, Any], message: str) -> Any:
    """The response of an engine that died with the request: aborted, no tokens (one per body of a batch)."""
    bodies = split_batch(payload)
    if bodies is not None:
        return [aborted(body, message) for body in bodies]
    return generate_response(
        rid=payload.get("rid") or new_rid(),
        text="",
        output_ids=[],
        prompt_tokens=0,
        finish_reason=finish_abort(message),
        weight_version="",
        logprobs=[] if payload.get("return_logprob") else None,
    )
