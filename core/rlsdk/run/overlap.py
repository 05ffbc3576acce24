"""The overlapped loop (``--async``, ``--max-policy-version-lag K``): the synchronous loop's verbs
(:func:`rlsdk.run.job.run_steps`) as a producer and a consumer. The producer (a thread of its own) runs the
rollout verb back to back and puts each step's groups, with the policy version its engines served, on a bounded
queue; the consumer (the trainer's thread) takes them in order and trains, syncs, records, evaluates and
checkpoints, so the engines generate while the trainer trains.

Versions: the trainer's ``weight_version`` counts its train steps; the engines serve version ``e``. A rollout
step may start on older weights only while the batch it makes cannot be more than ``K`` versions behind the
trainer when the trainer takes it; else it waits for the trainer's step and its sync. ``--async`` is ``K = 1``
(slime's ``train_async.py``: the next rollout generates while the trainer trains on the current one). When the
trainer takes a batch, a group sampled more than ``K`` versions before the trainer's (a partial rollout resumed
from older weights, say) is dropped with ``drop_reason: stale_policy``, written to discarded.jsonl and counted
in the ledger.

Syncs happen in the consumer only, between its train steps, when the engines are idle (the producer holds
:attr:`Overlap.engines` while it generates): never during a rollout step, a train step or an eval. Each is
followed by the trust checks of the synchronous loop (the probe check and the drift check against the noise
measured before the first train step), and before each rollout step the engines' weight versions are compared
with the version last synced to them: an engine restarted since then gets the trainer's weights first.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..training.session import TrainingSession
from ..training.sync import WeightSyncError
from ..training.trust import describe_stale, pick_probes
from ..types import RolloutFnTrainOutput, Sample, policy_versions
from .extensions import source_state
from .steps import StepRecorder

STALE = "stale_policy"
"""The drop reason of a group older than the lag bound when the trainer takes it."""
POLL_SECONDS = 0.2
"""How often a waiting thread looks at the stop request (a signal handler cannot notify a condition)."""
UNKNOWN = -1
"""The engines' version once one of them is found serving other weights: any trainer version is newer."""

log = logging.getLogger(__name__)


@dataclass
class Batch:
    """One rollout step's groups, with the data position right after it and the policy version they were
    sampled under."""

    rollout_id: int
    result: RolloutFnTrainOutput
    data_state: dict[str, Any]
    engine_version: int


@dataclass
class BusyClock:
    """When the engines generated and when the trainer trained: the busy fraction of a window."""

    spans: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: {"engine": [], "trainer": []})

    def add(self, role: str, start: float, end: float) -> None:
        self.spans[role].append((start, end))

    def fraction(self, role: str, start: float, end: float) -> float:
        if end <= start:
            return 0.0
        busy = sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.spans[role])
        self.spans[role] = [(a, b) for a, b in self.spans[role] if b > start]  # older spans are done with
        return busy / (end - start)


def sampled_version(group: list[Sample]) -> int | None:
    """The oldest policy version any sample of the group was (partly) sampled under."""
    return min((v for s in group for v in policy_versions(s)), default=None)


class Overlap:
    """The producer (rollouts) and the consumer (the trainer, this thread), and the versions between them."""

    def __init__(self, steps: StepRecorder, first: int) -> None:
        assert steps.training is not None
        self.steps = steps
        self.training: TrainingSession = steps.training
        self.runtime = steps.runtime
        self.first = first
        lag = steps.args.max_policy_version_lag
        self.lag = 1 if lag is None else lag
        self.batches: queue.Queue[Batch | BaseException | None] = queue.Queue(maxsize=self.lag + 1)
        """The bounded queue: the version rule keeps the producer at most ``lag + 1`` batches ahead."""
        self.engines = threading.Lock()
        """Held while the engines generate (the producer's step, the consumer's eval) or take weights."""
        self.versions = threading.Condition()
        self.trainer_version = self.engine_version = self.training.weight_version
        self.trained = 0  # batches the consumer is done with
        self.upcoming = first  # the next step the producer runs (num_rollout once it has run them all)
        self.probe: Sample | None = None  # of the last trained batch: the trust check's sample
        self.probes: list[Sample] = []  # of the last trained batch: the drift check's samples
        self.sync_metrics: dict[str, Any] = {}  # of the syncs since the last step was recorded
        self.clock = BusyClock()

    # ------------------------------------------------------------------ the producer

    def produce(self) -> None:
        """The rollout verb, back to back, each step started within the lag bound."""
        try:
            for rollout_id in range(self.first, self.steps.args.num_rollout):
                resynced = self.wait_for_weights(rollout_id)
                if resynced is None:
                    return
                with self.engines:  # the engines serve one version for the whole step
                    version, started = self.engine_version, time.monotonic()
                    try:
                        result = self.steps.generate(rollout_id)  # generate_rollout: one whole step
                    finally:
                        self.clock.add("engine", started, time.monotonic())
                    data_state = source_state(self.steps.data_source)
                if resynced:
                    result.metrics["train/engine_resyncs"] = resynced
                self.put(Batch(rollout_id, result, data_state, version))
                if result.metrics.get("rollout/stopped"):
                    return
        except BaseException as exc:  # the consumer raises it
            self.put(exc)
        finally:
            self.upcoming = self.steps.args.num_rollout
            self.put(None)

    def wait_for_weights(self, rollout_id: int) -> int | None:
        """Wait until step ``rollout_id`` may generate on the engines' weights (within the lag bound, the
        consumer syncing newer ones meanwhile), then the weight-version handshake (T21): an engine serving
        other weights than the version last synced to it (restarted since) makes the engines' version unknown,
        so that the consumer syncs again. How many engines were synced again; None when the run stops."""
        resynced, self.upcoming = 0, rollout_id
        while not self.runtime.stop.is_set:
            with self.versions:
                behind = rollout_id - self.first - self.trained  # batches before it not yet trained
                if (
                    self.engine_version == UNKNOWN
                    or self.trainer_version + behind - self.engine_version > self.lag
                ):
                    self.versions.wait(POLL_SECONDS)
                    continue
                version = self.engine_version
            stale = self.training.stale_engines(version)
            if not stale:
                return resynced
            if resynced:
                raise WeightSyncError(f"{describe_stale(stale, version)}, even after a new weight sync")
            log.warning("%s: syncing the weights again before the step", describe_stale(stale, version))
            with self.versions:
                self.engine_version = UNKNOWN
            resynced = len(stale)
        return None

    def put(self, item: Batch | BaseException | None) -> None:
        """Onto the bounded queue, waiting while it is full (unless the run stops: the consumer then drains
        nothing more)."""
        while True:
            try:
                self.batches.put(item, timeout=POLL_SECONDS)
                return
            except queue.Full:
                if self.runtime.stop.is_set:
                    return

    # ------------------------------------------------------------------ the consumer (this thread)

    def run(self) -> None:
        producer = threading.Thread(target=self.produce, name="rlsdk-rollouts", daemon=True)
        producer.start()
        untrained: list[tuple[int, RolloutFnTrainOutput]] = []
        next_id = self.first
        try:
            last = time.monotonic()
            while (item := self.next_batch()) is not None:
                if isinstance(item, BaseException):
                    raise item
                if self.runtime.stop.is_set:  # its groups wait in the buffer for --resume
                    untrained.append((item.rollout_id, item.result))
                    continue
                self.steps.status(f"step {item.rollout_id}: training")
                self.train(item)  # trainer, with the drop of groups older than the bound
                now = time.monotonic()
                item.result.metrics["async/engine_busy"] = self.clock.fraction("engine", last, now)
                item.result.metrics["async/trainer_busy"] = self.clock.fraction("trainer", last, now)
                last = now
                state = self.steps.record(item.rollout_id, item.result, item.data_state)  # outputs, run state
                self.steps.evaluate(item.rollout_id, item.result, state, self.sync_for_eval)  # eval, when due
                self.steps.checkpoint(item.rollout_id, item.result, state)  # checkpoint, when due
                next_id = item.rollout_id + 1
        finally:
            if producer.is_alive() and not self.runtime.stop.is_set:  # the trainer failed: stop rollouts
                self.runtime.stop.set("an error")
            while producer.is_alive():  # with a timeout: signal handlers run meanwhile
                producer.join(POLL_SECONDS)
        if self.runtime.stop.is_set:
            self.steps.stop(next_id, untrained)

    def next_batch(self) -> Batch | BaseException | None:
        """The producer's next batch; while waiting, the engines take the trainer's newest weights when
        they are idle and a rollout step is still to come (sync), and signal handlers run."""
        while True:
            if self.upcoming < self.steps.args.num_rollout:
                self.sync_when_idle()
            try:
                return self.batches.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue

    def sync_when_idle(self) -> None:
        """sync: the trainer's newest weights to the engines when they are newer and the engines idle (no
        rollout step, no eval), then the trust checks."""
        if self.trainer_version == self.engine_version or self.runtime.stop.is_set:
            return
        if self.engines.acquire(blocking=False):
            try:
                self.sync()
            finally:
                self.engines.release()

    def sync(self) -> None:
        """The trainer's latest weights to the engines, then the trust checks (the engines are held)."""
        metrics = self.training.sync()
        if self.probe is not None:
            metrics.update(self.training.check(self.probe, self.probes))
        with self.versions:
            self.engine_version = self.training.weight_version
            for key, value in metrics.items():  # the seconds add up over the syncs between two steps
                self.sync_metrics[key] = self.sync_metrics.get(key, 0) + value if "seconds" in key else value
            self.versions.notify_all()

    def train(self, batch: Batch) -> None:
        """Drop the groups older than the bound, train on the rest, and record the step's versions and
        syncs."""
        result = batch.result
        kept = self.drop_stale(batch)
        if kept:
            self.sync_when_idle()  # engines waiting for these weights get them before the trainer goes on
            started = time.monotonic()
            try:
                if self.engine_version == self.trainer_version:  # once: the drift check's baseline
                    self.training.measure_noise(pick_probes(kept))
                result.metrics.update(self.training.train_step(batch.rollout_id, result))
            finally:
                self.clock.add("trainer", started, time.monotonic())
            self.probe, self.probes = kept[-1][0], pick_probes(kept)
        with self.versions:
            self.trainer_version = self.training.weight_version
            self.trained += 1
            result.metrics.update(self.sync_metrics)
            self.sync_metrics = {}
            self.versions.notify_all()
        result.metrics["train/weight_version"] = self.training.weight_version

    def drop_stale(self, batch: Batch) -> list[list[Sample]]:
        """The batch's groups within the lag bound (kept in ``batch.result.samples``); the others dropped, in
        the ledger and the step's metrics."""
        result = batch.result
        version = self.training.weight_version
        lags: Counter[int] = Counter()
        kept: list[list[Sample]] = []
        stale: list[list[Sample]] = []
        for group in result.samples:
            sampled = sampled_version(group)
            lag = version - (batch.engine_version if sampled is None else sampled)
            lags[lag] += len(group)
            (stale if lag > self.lag else kept).append(group)
        for sample in (s for group in stale for s in group):
            sample.metadata["drop_reason"] = STALE
        moved = sum(len(group) for group in stale)
        if moved:  # kept by the rollout step, dropped here: the ledger moves them
            result.metrics["ledger/kept"] = result.metrics.get("ledger/kept", 0) - moved
            result.metrics["ledger/dropped"] = result.metrics.get("ledger/dropped", 0) + moved
            key = f"rollout/dynamic_filter/drop_{STALE}"
            result.metrics[key] = result.metrics.get(key, 0) + moved
        result.samples, result.discarded = kept, [*result.discarded, *stale]
        samples = sum(lags.values())
        result.metrics.update(
            {
                "async/lag_mean": sum(k * n for k, n in lags.items()) / samples if samples else 0.0,
                "async/lag_max": max(lags, default=0),
                **{f"async/lag_{k}": n for k, n in sorted(lags.items())},
                "async/stale_dropped": moved,
                "async/engine_version": batch.engine_version,
            }
        )
        return kept

    def sync_for_eval(self) -> None:
        """Before an eval: wait for the rollout step in progress and bring the engines up to the trainer's
        weights, so the eval measures the policy just trained (no sync runs during it: syncs are this
        thread's)."""
        with self.engines:
            if self.trainer_version > self.engine_version:
                self.sync()


def run_overlapped(steps: StepRecorder, first: int) -> None:
    """Steps ``first`` .. ``num_rollout - 1`` with rollouts overlapping training (see the module)."""
    Overlap(steps, first).run()
