"""The overlapped loop (``--async``, ``--max-policy-version-lag K``): rollouts run in a thread of their own
while the trainer trains, so the engines generate during training.

Versions: the trainer's ``weight_version`` counts its train steps; the engines serve version ``e``. Before
each rollout step the rollout thread brings the engines up to the trainer's latest weights when the trainer
is not in the middle of a step (the sync and its trust check are between rollout steps, never during one).
A rollout step may start with older weights only while the batch it makes cannot be more than ``K``
versions behind the trainer when the trainer takes it (at most ``K`` batches ahead of the trainer); else
it waits for the trainer's step and syncs. ``--async`` is ``K = 1`` (slime's ``train_async.py``: the next
rollout generates while the trainer trains on the current one). When the trainer takes a batch, a group
sampled more than ``K`` versions before the trainer's (a partial rollout resumed from older weights, say)
is dropped with ``drop_reason: stale_policy``, written to discarded.jsonl and counted in the ledger.

The trust checks are the synchronous loop's: before each rollout step the engines' weight versions are
compared with the version last synced to them (an engine restarted since then gets the trainer's weights
before it generates), and every sync is followed by the probe check and the drift check against the noise
measured before the first train step.
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
from ..types import RolloutFnTrainOutput, Sample
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
    """One rollout step's output, with the data position right after it and the engines' version."""

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


def policy_version(label: str) -> int | None:
    """A sample's ``weight_versions`` entry as a number: ``default`` (the starting weights) is 0; a label
    the run did not set is None."""
    return 0 if label == "default" else int(label) if label.isdigit() else None


def sampled_version(group: list[Sample]) -> int | None:
    """The oldest policy version any sample of the group was (partly) sampled under."""
    versions = [v for s in group for v in map(policy_version, s.weight_versions) if v is not None]
    return min(versions, default=None)


class Overlap:
    """The rollout thread and the trainer (this thread), and the versions between them."""

    def __init__(self, steps: StepRecorder, first: int) -> None:
        assert steps.training is not None
        self.steps = steps
        self.training: TrainingSession = steps.training
        self.args = steps.args
        self.runtime = steps.runtime
        self.first = first
        lag = self.args.max_policy_version_lag
        self.lag = 1 if lag is None else lag
        self.batches: queue.Queue[Batch | BaseException | None] = queue.Queue()
        self.changed = threading.Condition()
        self.trainer_version = self.engine_version = self.training.weight_version
        self.handled = 0  # batches the trainer is done with
        self.training_now = self.syncing = self.sync_wanted = self.generating = self.held = False
        self.probe: Sample | None = None  # of the last trained batch: the trust check's sample
        self.probes: list[Sample] = []  # of the last trained batch: the drift check's samples
        self.sync_metrics: dict[str, Any] = {}  # of the syncs since the last step was recorded
        self.clock = BusyClock()
        self.thread = threading.Thread(target=self.produce, name="rlsdk-rollouts", daemon=True)

    # ------------------------------------------------------------------ the rollout thread

    def produce(self) -> None:
        """Rollout steps back to back, each one started within the lag bound."""
        try:
            for rollout_id in range(self.first, self.args.num_rollout):
                started_ok, resynced = self.start_step(rollout_id)  # sets `generating`
                if not started_ok:
                    return
                version, started = self.engine_version, time.monotonic()
                try:
                    result = self.steps.generate(rollout_id)  # generate_rollout: one whole step
                    data_state = source_state(self.steps.data_source)
                finally:
                    self.clock.add("engine", started, time.monotonic())
                    with self.changed:
                        self.generating = False
                        self.changed.notify_all()
                if resynced:
                    result.metrics["train/engine_resyncs"] = resynced
                self.sync_if_free()  # before the batch is handed over: the trainer then waits less
                self.batches.put(Batch(rollout_id, result, data_state, version))
                if result.metrics.get("rollout/stopped"):
                    return
        except BaseException as exc:  # the trainer raises it
            self.batches.put(exc)
        finally:
            self.batches.put(None)

    def start_step(self, rollout_id: int) -> tuple[bool, int]:
        """:meth:`ready_for`, then the weight-version handshake (T21): an engine that serves other weights
        than the version last synced to it (restarted since) makes the engines' version unknown, so that
        the step waits for the trainer's weights. Whether the step may generate, and how many engines had
        to be synced again."""
        resynced = 0
        while self.ready_for(rollout_id):
            stale = self.training.stale_engines(self.engine_version)  # no sync runs while generating
            if not stale:
                return True, resynced
            described = describe_stale(stale, self.engine_version)
            with self.changed:
                self.generating, self.engine_version = False, UNKNOWN
                self.changed.notify_all()
            if resynced:
                raise WeightSyncError(f"{described}, even after a new weight sync")
            log.warning("%s: syncing the weights again before the step", described)
            resynced = len(stale)
        return False, resynced

    def ready_for(self, rollout_id: int) -> bool:
        """Wait until step ``rollout_id`` may generate within the bound, syncing the engines to the
        trainer's latest weights where the trainer is between steps; False when the run stops."""
        while True:
            with self.changed:
                if self.runtime.stop.is_set:
                    return False
                behind = rollout_id - self.first - self.handled  # batches before it not yet trained
                stale = self.trainer_version + behind - self.engine_version
                newer = self.trainer_version > self.engine_version
                if newer and not self.training_now and not self.held:
                    self.syncing = True
                elif stale <= self.lag and not self.held and self.engine_version != UNKNOWN:
                    self.sync_wanted = False
                    self.generating = True
                    return True
                else:
                    self.sync_wanted = newer  # the trainer lets the sync go first
                    self.changed.wait(POLL_SECONDS)
                    continue
            self.sync()

    def sync_if_free(self) -> None:
        """Sync now if the trainer has newer weights and is between steps (from either thread)."""
        with self.changed:
            if (
                self.trainer_version <= self.engine_version
                or self.training_now
                or self.syncing
                or self.generating
                or self.runtime.stop.is_set
            ):
                return
            self.syncing = True
        self.sync()

    def sync(self) -> None:
        """The trainer's latest weights to the engines, then the trust check (``syncing`` is set)."""
        try:
            metrics = self.training.sync()
            if self.probe is not None:
                metrics.update(self.training.check(self.probe, self.probes))
        finally:
            with self.changed:
                self.syncing = self.sync_wanted = False
                self.changed.notify_all()
        with self.changed:
            self.engine_version = self.training.weight_version
            for key, value in metrics.items():  # the seconds add up over the syncs between two steps
                self.sync_metrics[key] = self.sync_metrics.get(key, 0) + value if "seconds" in key else value

    # ------------------------------------------------------------------ the trainer (this thread)

    def run(self) -> None:
        self.thread.start()
        untrained: list[tuple[int, RolloutFnTrainOutput]] = []
        next_id = self.first
        try:
            last = time.monotonic()
            while True:
                item = self.next_batch()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                if self.runtime.stop.is_set:  # its groups wait in the buffer for --resume
                    untrained.append((item.rollout_id, item.result))
                    continue
                self.steps.status(f"step {item.rollout_id}: training")
                self.train(item)
                now = time.monotonic()
                item.result.metrics.update(
                    {
                        "async/engine_busy": self.clock.fraction("engine", last, now),
                        "async/trainer_busy": self.clock.fraction("trainer", last, now),
                    }
                )
                last = now
                state = self.steps.record(item.rollout_id, item.result, item.data_state)  # outputs, run state
                self.steps.evaluate(item.rollout_id, item.result, state, self.sync_for_eval)  # eval, when due
                self.steps.checkpoint(item.rollout_id, item.result, state)  # checkpoint, when due
                next_id = item.rollout_id + 1
                with self.changed:
                    self.handled += 1
                    self.changed.notify_all()
        finally:
            if self.thread.is_alive() and not self.runtime.stop.is_set:  # the trainer failed: stop rollouts
                self.runtime.stop.set("an error")
            while self.thread.is_alive():  # with a timeout: signal handlers run meanwhile
                self.thread.join(POLL_SECONDS)
        if self.runtime.stop.is_set:
            self.steps.stop(next_id, untrained)

    def next_batch(self) -> Batch | BaseException | None:
        """The rollout thread's next batch, waking up now and then so that signal handlers run."""
        while True:
            try:
                return self.batches.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue

    def train(self, batch: Batch) -> None:
        """Drop the groups older than the bound, train on the rest (after any sync the rollout thread
        waits for), and record the step's versions and syncs."""
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
        for group in stale:
            for sample in group:
                sample.metadata["drop_reason"] = STALE
        if stale:  # kept by the rollout step, dropped here: the ledger moves them
            moved = sum(len(group) for group in stale)
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
                "async/stale_dropped": sum(len(group) for group in stale),
                "async/engine_version": batch.engine_version,
            }
        )
        if kept:
            self.sync_if_free()  # engines waiting for these weights get them before the trainer goes on
            with self.changed:
                while self.syncing or self.sync_wanted:
                    self.changed.wait(POLL_SECONDS)
                self.training_now = True  # no sync starts from here
                same_weights = self.engine_version == self.trainer_version
            started = time.monotonic()
            try:
                if same_weights:  # once: the drift check's baseline
                    self.training.measure_noise(pick_probes(kept))
                result.metrics.update(self.training.train_step(batch.rollout_id, result))
            finally:
                self.clock.add("trainer", started, time.monotonic())
                with self.changed:
                    self.training_now = False
                    self.trainer_version = self.training.weight_version
                    self.probe, self.probes = kept[-1][0], pick_probes(kept)
                    self.changed.notify_all()
        with self.changed:
            result.metrics.update(self.sync_metrics)
            self.sync_metrics = {}
        result.metrics["train/weight_version"] = self.training.weight_version

    def sync_for_eval(self) -> None:
        """Hold the rollout thread between two steps and bring the engines up to the trainer's weights:
        the eval measures the policy just trained."""
        with self.changed:
            self.held = True
            while self.generating or self.syncing:
                self.changed.wait(POLL_SECONDS)
            newer = self.trainer_version > self.engine_version
            self.syncing = newer
        try:
            if newer:
                self.sync()
        finally:
            with self.changed:
                self.held = False
                self.changed.notify_all()


def run_overlapped(steps: StepRecorder, first: int) -> None:
    """Steps ``first`` .. ``num_rollout - 1`` with rollouts overlapping training (see the module)."""
    Overlap(steps, first).run()
