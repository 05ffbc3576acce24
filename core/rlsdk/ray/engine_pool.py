"""Engines as Ray actors behind one engine: least-loaded routing, and engines that die survived.

:class:`RayEnginePool` is the run's engine when ``--ray`` is on, so the rollout step, the generators and the
weight sync use it as they use one engine. Each request goes to the live engine with the fewest requests
in flight. An engine that dies (its actor killed, its process SIGKILLed, or silent to a health check for
``rollout_health_check_timeout`` seconds while it answers no request) is noticed by its requests failing,
at once, or by the next health check, every second (an SGLang engine's health is its server's: a server
that exits in a live actor is a dead engine); each of its requests in flight
then comes back as an *aborted* response with no tokens, so the rollout step returns its group to the
buffer, as it returns any aborted group: the ledger balances and nothing is lost. The engine is started
again, given the current weights, checked against the last trust probe, and rejoins.

What takes its place, quickest first: a *spare* (``ray_spare_engines``: an engine started with its model
loaded, so only the weights and the trust check are left), a *standby* (``ray_standby_engines``, one by
default, none for SGLang engines on GPUs: an actor whose process is up with the engine's imports done and
no model loaded, so the replacement skips Ray's worker start and the imports, the bulk of a cold start),
else a new actor. A used spare or standby is replaced in the background. Standbys are prepared once the run
is ready for its first step (:meth:`RayEnginePool.prepare_standbys`), not while the engines and the trainer
start: on a small machine they would compete with them for the cores.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ..engines.engine import InferenceEngine
from ..engines.protocol import ReplicaLostError, finish_abort, generate_response, new_rid, split_batch
from ..errors import RlsdkError
from ..training.sync import default_sync_timeout
from .cluster import ActorStartError, describe_place, first_line, free_resources, import_ray, place, start
from .engine_actor import (
    EngineActor,
    EngineDiedError,
    actor_device,
    actor_resources,
    engine_count,
    launches_servers,
    standby_count,
)
from .environments import check_worker
from .trainer_actor import trainer_resources
from ..config import RolloutConfig
from ..plugins.kinds import Engine

log = logging.getLogger(__name__)

HEALTH_INTERVAL = 1.0
"""Seconds between health checks of each live engine."""
HEALTH_CALL_MARGIN = 5.0
"""Seconds a health check's Ray call may take beyond the engine's own check (``rollout_health_check_timeout``);
an actor that does not answer within both is taken for dead (hung)."""
PROBE_WAIT = 30.0
"""Seconds a restarted engine waits for the trust probe of a weight sync under way."""
PUSH_METHODS = {"state": "update_weights", "disk": "update_weights_from_disk", "delta": "pull_weights"}
"""The engine actor's method for each kind of weights a sync pushes (and a restarted engine catches up on)."""
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
    by: str = "new"
    """What took its place: ``spare``, ``standby`` or ``new`` (a new actor)."""
    marks: dict[str, float] = field(default_factory=dict)
    """When (``time.time()``) its replacement got past each stage: ``created`` (the actor's process up
    and the actor built in it), ``prepared`` (the engine's imports done), ``started`` (model loaded),
    ``weights`` (the current weights taken) and ``trusted`` (past the trust check); a spare or standby
    skips the stages it had done before."""


@dataclass(eq=False)
class Replica(InferenceEngine):
    """One engine actor seen from the driver, as an engine (the trust check probes each)."""

    index: int
    pool: RayEnginePool = field(repr=False)
    actor: Any = None
    group: Any = None
    """The actor's placement group (SGLang engines on GPUs), removed with the actor."""
    actor_index: int = -1
    """The index the actor was created with: the engine's, or a number after the engines' for a spare or
    standby (its SGLang server's seed and log)."""
    info: dict[str, Any] = field(default_factory=dict)
    place_text: str = ""
    alive: bool = False
    in_flight: int = 0
    sent: int = 0

    @property
    def name(self) -> str:
        return f"engine {self.index} ({self.place_text})"

    async def generate(self, payload: dict[str, Any]) -> Any:
        """A request to this engine alone (the trust check's probe)."""
        return await self._on_its_own("generate", payload)

    async def abort(self, rid: str | None = None) -> None:
        await self._on_its_own("abort", rid)

    async def model_info(self) -> dict[str, Any]:
        """What the engine serves (the weight-version handshake asks each engine)."""
        result: dict[str, Any] = await self._on_its_own("model_info")
        return result

    async def weight_checksums(self) -> Any:
        """This engine's checksums (the trust check compares each engine's)."""
        return await self._on_its_own("weight_checksums")

    async def _on_its_own(self, method: str, *args: Any) -> Any:
        """``method`` of this engine's actor: if the engine is dead or dies meanwhile, or does not answer
        within its deadline (:func:`call_deadline`), its pool is told and a :class:`ReplicaLostError`
        raised."""
        actor = self.actor
        timeout, option = call_deadline(self.pool.args, method)
        try:
            return await asyncio.wait_for(_await(getattr(actor, method).remote(*args)), timeout)
        except TimeoutError:
            hung = f"{method} not done within {timeout:g}s ({option})"
            self.pool._lost(self, actor, hung)
            raise ReplicaLostError(f"{self.name} was taken for hung: {hung}") from None
        except Exception as exc:
            cause = death_cause(exc)
            if cause is None:
                raise
            self.pool._lost(self, actor, cause)
            raise ReplicaLostError(f"{self.name} died while it was asked on its own ({cause})") from exc


class RayEnginePool(InferenceEngine):
    """:func:`engine_count` actors of the engine plugin ``engine_spec`` (a name the actors resolve).

    SGLang engines on GPUs each get a placement group (one bundle of ``rollout_num_gpus_per_engine`` GPUs,
    STRICT_PACK) created before the actor and removed with it, so a replaced engine's GPUs are free."""

    def __init__(
        self,
        args: RolloutConfig,
        engine_spec: str,
        driver_plugins: dict[str, str | None],
        *,
        standbys_at_start: bool = True,
    ) -> None:
        """``standbys_at_start``: prepare the standbys as soon as the engines are up; False leaves that
        to a call of :meth:`prepare_standbys` (the run's trainer starts first)."""
        self.args = copy.copy(args)
        """The options every engine actor is built from: those of the run's start (the run then sets
        ``sglang_router_ip``/``_port`` to this pool's own address, which is no engine's to launch)."""
        self.standbys_at_start = standbys_at_start
        self.engine_spec = engine_spec
        self.driver_plugins = driver_plugins
        self.replicas_ = [Replica(index=i, pool=self) for i in range(engine_count(args))]
        self.standby_count = standby_count(args)
        self._next_index = len(self.replicas_)
        """The index of the next spare or standby actor."""
        self.recoveries: list[Recovery] = []
        self.model_path: str | None = None
        self._weights: tuple[str, Any, str | None] | None = None
        """The weights the engines serve since the last sync: ("state", object ref, version) or ("disk",
        folder, version); None before the first sync."""
        self._probe: Any = None
        """The TrustProbe the engines passed with those weights (None while a sync is under way)."""
        self._sync_lock = asyncio.Lock()
        self._pushes = 0
        """Weight pushes begun plus those ended: odd while one is under way. No engine answers its health
        check while it loads weights (SGLang holds every request), so pushes and checks do not overlap."""
        self._changed = asyncio.Condition()
        self._failure: BaseException | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._rids: dict[str, Replica] = {}
        self._spares: list[Replica] = []
        """Engines started beside the serving ones (``ray_spare_engines``), each ready to take the place of
        one that dies."""
        self._standbys: list[Replica] = []
        """Actors prepared and not started (``ray_standby_engines``), each ready to start in a dead
        engine's place."""
        self._preparing = 0
        """Standbys being prepared."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._standbys_asked = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._check_gpus()
        spares = [Replica(index=-1, pool=self) for _ in range(self.args.ray_spare_engines)]
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
        if self.standbys_at_start:
            self.prepare_standbys()

    def prepare_standbys(self) -> None:
        """Start preparing the :func:`standby_count` standbys, once (callable from any thread), not waited
        for: until one is ready, a dead engine's replacement waits for the one being prepared."""
        assert self._loop is not None, "start() first"
        if self._standbys_asked:
            return
        self._standbys_asked = True

        def spawn() -> None:
            for _ in range(self.standby_count):
                self._spawn_standby()

        self._loop.call_soon_threadsafe(spawn)

    def _spawn_standby(self) -> None:
        self._preparing += 1  # now, so that a recovery waits for it rather than start a new actor
        self._spawn(self._add_standby())

    def _check_gpus(self) -> None:
        """More engine actors launching servers on GPUs (engines, spares, standbys; with a trainer on GPUs, its
        GPUs too) than the cluster has GPUs for would wait for Ray forever: an error naming both counts,
        before any starts."""
        args = self.args
        if not launches_servers(args):
            return
        per_engine = args.rollout_num_gpus_per_engine
        actors = len(self.replicas_) + args.ray_spare_engines + self.standby_count
        trainer = trainer_resources(args)["num_gpus"] if args.train else 0
        needed = actors * per_engine + trainer
        have = import_ray().cluster_resources().get("GPU", 0)
        if needed > have:
            raise RlsdkError(
                f"{needed:g} GPUs needed for the {Engine.chosen(args)} engines ({len(self.replicas_)} engines, "
                f"{args.ray_spare_engines} spare, {self.standby_count} standby; {per_engine} GPUs each)"
                f"{f' and the trainer ({trainer:g})' if trainer else ''}, but the Ray cluster has "
                f"{have:g}: lower --rollout-num-gpus, ray_spare_engines or ray_standby_engines"
                f"{', train on CPU (--train-device cpu)' if trainer else ''}, or add GPU nodes"
            )

    async def _start_actor(self, replica: Replica, what: str | None = None) -> None:
        """Create, place, check and start one engine actor within ``ray_start_timeout`` each."""
        what = what or f"engine {replica.index}"
        await self._place_actor(replica, what)
        await self._start_engine(replica, what)

    async def _place_actor(self, replica: Replica, what: str) -> None:
        """Create one engine actor, wait for it to be placed, check its plugins and prepare its engine
        (:meth:`EngineActor.prepare`), within ``ray_start_timeout`` each."""
        ray = import_ray()
        args = self.args
        resources = actor_resources(args)
        if replica.index >= 0:
            index = replica.index
        else:
            index, self._next_index = self._next_index, self._next_index + 1
        group = await self._placement_group(resources, what) if launches_servers(args) else None
        try:
            actor = (
                ray.remote(EngineActor)
                .options(max_concurrency=1000, max_restarts=0, **resources, **_in_group(group))
                .remote(args, index)
            )
            info = await place(actor, actor.where.remote(), what, resources, args.ray_start_timeout)
            place_text = describe_place(info, device=actor_device(args), port=None)
            try:
                check_worker(what, info, self.driver_plugins)  # plugins differ: stop before the first step
            except RlsdkError:
                ray.kill(actor)
                raise
            info["prepared_at"] = await start(
                actor, what, place_text, actor.prepare.remote(), args.ray_start_timeout
            )
        except BaseException:
            if group is not None:
                ray.util.remove_placement_group(group)
            raise
        replica.actor, replica.group, replica.info, replica.place_text = actor, group, info, place_text
        replica.actor_index = index

    async def _placement_group(self, resources: dict[str, Any], what: str) -> Any:
        """A placement group of one bundle with the actor's resources on one node (STRICT_PACK), ready
        within ``ray_start_timeout``."""
        ray = import_ray()
        bundle = {"GPU": resources["num_gpus"], "CPU": resources["num_cpus"]}
        group = ray.util.placement_group([{k: v for k, v in bundle.items() if v}], strategy="STRICT_PACK")
        try:
            await asyncio.wait_for(_await(group.ready()), self.args.ray_start_timeout)
        except BaseException as exc:  # not ready in time, or the pool closing meanwhile: it holds no GPU
            ray.util.remove_placement_group(group)
            if not isinstance(exc, TimeoutError):
                raise
            raise ActorStartError(
                f"{what}'s placement group was not ready within {self.args.ray_start_timeout:g}s "
                f"(ray_start_timeout): it asks for {bundle} on one node; the cluster has free: "
                f"{free_resources() or 'nothing'}"
            ) from None
        return group

    def _release(self, replica: Replica) -> None:
        """Kill the replica's actor and remove its placement group (freeing its GPUs)."""
        ray = import_ray()
        if replica.actor is not None:
            ray.kill(replica.actor)
        if replica.group is not None:
            ray.util.remove_placement_group(replica.group)
            replica.group = None

    async def _start_engine(self, replica: Replica, what: str) -> None:
        """Start the engine of a placed actor (:meth:`_place_actor`) within ``ray_start_timeout``."""
        args, info = self.args, replica.info
        actor = replica.actor
        index = replica.index if replica.index >= 0 else replica.actor_index
        try:
            engine = await start(
                actor, what, replica.place_text, actor.start.remote(index), args.ray_start_timeout
            )
        except BaseException:
            self._release(replica)
            raise
        if engine.get("url"):
            from urllib.parse import urlparse

            replica.place_text = describe_place(
                info, device=actor_device(args), port=urlparse(engine["url"]).port
            )
        replica.info = {**info, "engine": engine}

    async def close(self) -> None:
        self._standbys_asked = True  # none prepared from now on
        self._closing = True  # nor any task started: a health check ending now would start a restart
        while self._tasks:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        ray = import_ray()
        for replica in [*self.replicas_, *self._spares, *self._standbys]:
            if replica.actor is not None:
                try:
                    await asyncio.wait_for(replica.actor.close.remote(), 10)
                except (ray.exceptions.RayError, TimeoutError):
                    pass
            self._release(replica)
            replica.alive = False

    def _spawn(self, coro: Any) -> None:
        if self._closing:  # an actor started now would outlive the pool, holding its GPU
            coro.close()
            return
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ routing

    def replicas(self) -> list[InferenceEngine]:
        return [r for r in self.replicas_ if r.alive]

    @property
    def at_full_strength(self) -> bool:
        """Every engine serving, and every spare and standby the run asked for ready."""
        return (
            all(r.alive for r in self.replicas_)
            and len(self._spares) >= self.args.ray_spare_engines
            and len(self._standbys) >= self.standby_count
        )

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
        replica = await self._pick()
        actor = replica.actor
        replica.in_flight += 1
        replica.sent += 1
        rid = payload.get("rid") if isinstance(payload.get("rid"), str) else None
        if rid:
            self._rids[rid] = replica
        try:
            return await actor.generate.remote(payload)
        except Exception as exc:
            cause = death_cause(exc)
            if cause is None:
                raise
            self._lost(replica, actor, cause)
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
        info = await replica._on_its_own("model_info")
        return {**info, "num_engines": len(self.replicas_)}

    async def pause(self, mode: str = "abort") -> None:
        await self._on_each([r for r in self.replicas_ if r.alive], "pause", mode)

    async def resume(self) -> None:
        await self._on_each([r for r in self.replicas_ if r.alive], "resume")

    async def flush_cache(self) -> bool:
        return all(await self._on_each([r for r in self.replicas_ if r.alive], "flush_cache"))

    async def _on_each(self, replicas: list[Replica], method: str, *args: Any) -> list[Any]:
        """Call ``method`` on each engine; an engine that died meanwhile, or that has not answered within
        its deadline (:func:`call_deadline`), is left to its restart."""
        timeout, option = call_deadline(self.args, method)
        actors = [r.actor for r in replicas]
        results = await asyncio.gather(
            *(asyncio.wait_for(_await(getattr(a, method).remote(*args)), timeout) for a in actors),
            return_exceptions=True,
        )
        answered = []
        for replica, actor, result in zip(replicas, actors, results, strict=True):
            if not isinstance(result, BaseException):
                answered.append(result)
            elif isinstance(result, TimeoutError):
                self._lost(replica, actor, f"{method} not done within {timeout:g}s ({option})")
            elif (cause := death_cause(result)) is not None:
                self._lost(replica, actor, cause)
            else:
                raise result
        return answered

    # ------------------------------------------------------------------ weights

    async def update_weights(self, state_dict: Any, weight_version: str | None = None) -> None:
        """Put the weights in Ray's object store once (:func:`.weights.to_shared`, unless they are there
        already, as a remote trainer's are) and have every live engine take them; a restarted engine takes
        the same ones."""
        from .weights import to_shared  # torch: only where the trainer is in this process

        ray = import_ray()
        ref = (
            state_dict
            if isinstance(state_dict, ray.ObjectRef)
            else await asyncio.to_thread(lambda: ray.put(to_shared(state_dict)))
        )
        await self._push(("state", ref, weight_version))

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> None:
        await self._push(("disk", model_path, weight_version))

    async def pull_weights(self, pull: Any, weight_version: str | None = None) -> None:
        """Each engine applies the delta version on its own host (a restarted one pulls every version it
        lacks, from its base)."""
        await self._push(("delta", pull, weight_version))

    async def _push(self, weights: tuple[str, Any, str | None]) -> None:
        """Have every live engine take ``weights`` (a restarted one takes them later, in :meth:`_catch_up`)."""
        kind, value, version = weights
        method = PUSH_METHODS[kind]
        async with self._sync_lock:
            self._weights, self._probe = weights, None
            self._pushes += 1
            try:
                await self._on_each([r for r in self.replicas_ if r.alive], method, value, version)
            finally:
                self._pushes += 1

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
        self._release(replica)  # a hung actor: its requests in flight fail now; its GPUs are freed
        self._spawn(self._recover(replica, recovery))

    async def _recover(self, replica: Replica, recovery: Recovery) -> None:
        """Start the engine again, give it the current weights, check it, let it rejoin; after
        :data:`MAX_RESTARTS` failed attempts the run stops."""
        ray = import_ray()
        error: BaseException | None = None
        what = f"engine {replica.index}"
        for _ in range(MAX_RESTARTS):
            try:
                recovery.marks.clear()
                if self._spares:  # a started spare takes its place; another spare starts meanwhile
                    recovery.by = "spare"
                    self._take_place(replica, self._spares.pop(0))
                    self._spawn(self._add_spare())
                elif standby := await self._next_standby():  # it starts in its place
                    recovery.by = "standby"
                    self._take_place(replica, standby)
                    await self._start_engine(replica, what)
                else:
                    recovery.by = "new"
                    await self._place_actor(replica, what)
                    recovery.marks.update(created=replica.info["created_at"])
                    recovery.marks.update(prepared=replica.info["prepared_at"])
                    await self._start_engine(replica, what)
                if "engine" in replica.info and recovery.by != "spare":
                    recovery.marks["started"] = replica.info["engine"]["started_at"]
                async with self._sync_lock:
                    await self._catch_up(replica, recovery)
                    replica.alive = True
                recovery.rejoined_at = time.time()
                log.warning(
                    "%s rejoined %.1fs after it was lost",
                    replica.name,
                    recovery.rejoined_at - recovery.detected_at,
                )
                if recovery.by == "standby":  # prepared now, not to slow the restart down
                    self._spawn_standby()
                await self._notify()
                return
            except asyncio.CancelledError:
                raise
            except (ActorStartError, ReplicaLostError, ray.exceptions.RayActorError) as exc:  # a fresh actor
                error = exc
            except Exception as exc:  # noqa: BLE001 - a failed trust check or weight load: not to be trusted
                error = exc
                break
        self._failure = EngineLostError(
            f"engine {replica.index} could not be brought back after it died ({recovery.cause}): {error}"
        )
        log.error("%s", self._failure)
        await self._notify()

    @staticmethod
    def _take_place(replica: Replica, other: Replica) -> None:
        replica.actor, replica.group, replica.info = other.actor, other.group, other.info
        replica.place_text, replica.actor_index = other.place_text, other.actor_index

    async def _add_spare(self) -> None:
        spare = Replica(index=-1, pool=self)
        try:
            await self._start_actor(spare, "a spare engine")
        except ActorStartError as exc:
            log.warning("no spare engine: %s", exc)
            return
        self._spares.append(spare)

    async def _add_standby(self) -> None:
        standby = Replica(index=-1, pool=self)
        try:
            await self._place_actor(standby, "a standby engine")
            self._standbys.append(standby)
        except RlsdkError as exc:  # not placed, not started, or other plugins: the run goes on without
            log.warning("no standby engine: %s", exc)
        finally:
            self._preparing -= 1
            await self._notify()

    async def _next_standby(self) -> Replica | None:
        """A prepared standby: one that is ready, else the first being prepared (it is further on than a
        new actor would be), once it is; None when there is none."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._standbys or not self._preparing)
        return self._standbys.pop(0) if self._standbys else None

    async def _catch_up(self, replica: Replica, recovery: Recovery) -> None:
        """Give a restarted engine the weights the others serve, and check it against their trust probe
        (waiting, while a sync is under way, for the probe of the weights it took)."""
        if self._weights is None:
            return  # no sync yet: it loaded the starting weights, as the others did
        kind, value, version = self._weights
        method = getattr(replica.actor, PUSH_METHODS[kind])
        timeout = default_sync_timeout(self.args)
        try:
            await asyncio.wait_for(_await(method.remote(value, version)), timeout)
        except TimeoutError:
            raise ReplicaLostError(
                f"{replica.name} did not take the weights within {timeout:g}s (--weight-sync-timeout)"
            ) from None
        recovery.marks["weights"] = time.time()
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: self._probe is not None), PROBE_WAIT)
        await self._probe.check(replica)
        recovery.marks["trusted"] = time.time()

    async def _health_checks(self) -> None:
        """Ping every live engine each :data:`HEALTH_INTERVAL`, each on its own (a slow answer holds up no
        other engine's check), except while weights are pushed (as slime pauses its health monitor then);
        a dead or silent one is lost."""
        checking: set[Any] = set()  # the actors with a check under way
        while True:
            await asyncio.sleep(HEALTH_INTERVAL)
            if self._pushes % 2:
                continue
            for replica in self.replicas_:
                if replica.alive and replica.actor not in checking:
                    checking.add(replica.actor)
                    self._spawn(self._check_health(replica, replica.actor, checking))

    async def _check_health(self, replica: Replica, actor: Any, checking: set[Any]) -> None:
        ray = import_ray()
        timeout = self.args.rollout_health_check_timeout + HEALTH_CALL_MARGIN
        pushes = self._pushes
        try:
            problem = await asyncio.wait_for(_await(actor.health.remote()), timeout)
            cause = None if problem is None else f"its engine is down: {problem}"
        except TimeoutError:
            cause = f"no answer to a health check within {timeout:g}s"
        except ray.exceptions.RayError as exc:
            self._lost(replica, actor, f"its actor died: {first_line(exc)}")
            return
        finally:
            checking.discard(actor)
        if cause is not None and self._pushes == pushes:  # a check that overlapped a push tells nothing
            self._lost(replica, actor, cause)


def call_deadline(args: RolloutConfig, method: str) -> tuple[float | None, str]:
    """Seconds an engine actor may take to answer ``method``, and the option that sets it: a weight load
    ``--weight-sync-timeout``, a generation (the trust check's probe) ``--generate-timeout`` (None: as long
    as it takes, as that option promises), any other call ``--ray-call-timeout``."""
    if method in PUSH_METHODS.values():
        return default_sync_timeout(args), "--weight-sync-timeout"
    if method == "generate":
        return args.generate_timeout, "--generate-timeout"
    return args.ray_call_timeout, "--ray-call-timeout"


def death_cause(exc: BaseException) -> str | None:
    """Why ``exc`` means its engine is dead (its actor, or the engine in it), or None when it does not."""
    ray = import_ray()
    if isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)):
        return f"its actor died: {first_line(exc)}"
    if isinstance(exc, EngineDiedError):  # Ray's task error is an instance of its cause's class too
        return f"its engine died: {first_line(exc)}"
    return None


async def _await(ref: Any) -> Any:
    return await ref


def _in_group(group: Any) -> dict[str, Any]:
    """The actor options placing an actor in ``group``'s only bundle (none without a group)."""
    if group is None:
        return {}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)}


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
