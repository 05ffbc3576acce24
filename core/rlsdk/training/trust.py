"""Is the engine serving the trainer's weights? Three checks beside the per-sync trust probe of
:mod:`rlsdk.training.sync`:

- **weights** (:func:`check_weights`): the checksum of every tensor each engine holds (SGLang's
  ``/weights_checker``) against the trainer's own tensors, fused as the engine holds them. Exact: a tensor
  a sync missed differs, a tensor it reached never does, whatever the precision. Where it verified every
  tensor, the log-prob gaps below measure numeric noise alone and stop nothing.
- **weight-version handshake** (:func:`stale_replicas`): every engine reports the weight version it
  serves (``/model_info``'s ``weight_version``); before a step generates, and again before its samples are
  trained on, the loop compares it with the trainer's. An engine restarted since the last sync (serving
  ``default``, its starting weights) is noticed before its samples are used.
- **drift against the run's own baseline** (:class:`DriftCheck`), for engines without checksums: the
  maximum log-prob gap of one probe,
  compared with a fixed tolerance, must allow for bfloat16's rounding on CUDA (up to 2 nats) and so lets a
  sync that missed one tensor through. The mean per-token gap over several probes is far steadier; before
  the first train step, when both sides hold the same weights, it measures the pair's numeric noise, and
  after each sync a mean gap of more than ``ratio`` times that noise (and above a small floor) is a partial
  or failed sync.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..engines.engine import InferenceEngine
from ..engines.protocol import ReplicaLostError
from ..types import Sample
from .sync import WeightSyncError, engine_log_probs
from .trainer import PolicyTrainer

PROBES = 8
"""Probe samples (from distinct groups of the step) the drift check scores: with 4 the noise baseline of
identical GPU runs moved 2.5x (0.013-0.033 nats)."""
DRIFT_RATIO = 4.0
"""A mean per-token gap this many times the baseline noise is a failed sync."""
DRIFT_FLOOR = 1e-4
"""Nats a token the drift threshold never goes below: float32 noise (1e-7) times the ratio would flag a
reordered sum. On the tiny Llama on CPU a sync that skipped one tensor of the last layer shows 2e-3 after
one step at lr 1e-2, of the first layer 2.5e-2; a correct one 1e-7 (tests/faults/test_weight_trust.py)."""


def expected_versions(weight_version: int) -> set[str]:
    """What an engine serving the trainer's weights reports: ``default`` before any sync (SGLang's and the
    embedded engine's name for the starting weights), else the sync's number."""
    return {"default", "0"} if weight_version == 0 else {str(weight_version)}


async def stale_replicas(engine: InferenceEngine, weight_version: int) -> list[tuple[str, str]]:
    """(engine name, version it serves) of each replica not serving ``weight_version``; engines that do
    not report a version are taken at their word."""
    stale = []
    for replica in engine.replicas():
        try:
            served = (await replica.model_info()).get("weight_version")
        except ReplicaLostError:  # its pool brings it back with the current weights
            continue
        if served is not None and str(served) not in expected_versions(weight_version):
            stale.append((getattr(replica, "name", type(replica).__name__), str(served)))
    return stale


def pick_probes(groups: list[list[Sample]], count: int = PROBES) -> list[Sample]:
    """The first sample with a response of up to ``count`` groups (spread over the batch)."""
    with_response = [next((s for s in g if s.response_length), None) for g in groups]
    usable = [s for s in with_response if s is not None]
    step = max(1, len(usable) // count)
    return usable[::step][:count]


async def token_gaps(
    engine: InferenceEngine, trainer_log_probs: list[list[float]], probes: list[Sample]
) -> list[float]:
    """|engine - trainer| log-prob of every response token of ``probes``."""
    gaps: list[float] = []
    for probe, expected in zip(probes, trainer_log_probs, strict=True):
        served = await engine_log_probs(engine, probe)
        gaps.extend(abs(a - b) for a, b in zip(served, expected, strict=True))
    return gaps


@dataclass
class DriftCheck:
    """The mean per-token gap after a sync against the run's own noise (see the module's docstring)."""

    baseline: float | None = None
    """Mean per-token gap with identical weights on both sides, measured before the first train step."""
    ratio: float = DRIFT_RATIO

    @property
    def threshold(self) -> float:
        assert self.baseline is not None
        return max(self.ratio * self.baseline, DRIFT_FLOOR)

    async def measure(
        self, engine: InferenceEngine, trainer: PolicyTrainer, probes: list[Sample]
    ) -> list[float]:
        """The mean gap of each replica (a replica lost meanwhile is left out)."""
        expected = await asyncio.to_thread(trainer.response_log_probs, probes)
        means = []
        for replica in engine.replicas():
            try:
                gaps = await token_gaps(replica, expected, probes)
            except ReplicaLostError:
                continue
            if gaps:
                means.append(sum(gaps) / len(gaps))
        return means

    def set_baseline(self, means: list[float]) -> None:
        self.baseline = max(means, default=0.0)

    def check(self, means: list[float], weight_version: int) -> float:
        """The largest replica mean; over :attr:`threshold` a :class:`WeightSyncError`."""
        worst = max(means, default=0.0)
        if worst > self.threshold:
            raise WeightSyncError(
                f"trust check failed after weight sync {weight_version}: the engine's log-probs differ "
                f"from the trainer's by {worst:.3g} nats a token on average over {PROBES} probes, "
                f"{worst / max(self.baseline or 0.0, 1e-12):.0f}x this run's own noise ({self.baseline:.3g} "
                f"before the first step; threshold {self.threshold:.3g}): part of the weights did not reach "
                "the engine"
            )
        return worst


@dataclass
class WeightsVerdict:
    """What :func:`check_weights` compared."""

    tensors: int = 0
    """Tensors compared on every engine (fused ones count once)."""
    unverified: list[str] = field(default_factory=list)
    """The trainer's tensors an engine holds under none of the names its layout gives: not compared."""
    unavailable: str | None = None
    """Why nothing was compared (an engine offers no checksums, or holds tensor-parallel shards)."""

    @property
    def complete(self) -> bool:
        """Every tensor of the trainer's compared on every engine, all equal."""
        return self.unavailable is None and self.tensors > 0 and not self.unverified


async def check_weights(
    engine: InferenceEngine, trainer: PolicyTrainer, weight_version: int
) -> WeightsVerdict:
    """Every tensor each engine holds against the trainer's, by checksum; a tensor that differs is a
    :class:`WeightSyncError` naming it. The trainer computes its checksums once per engine layout."""
    expected_by_layout: dict[
        tuple[tuple[str, tuple[str, ...]], ...], dict[str, tuple[list[str], list[str]]]
    ] = {}
    verdict = WeightsVerdict(tensors=-1)
    for replica in engine.replicas():
        try:
            served = await replica.weight_checksums()
        except ReplicaLostError:  # its pool brings it back with the current weights
            continue
        if not served:
            return WeightsVerdict(unavailable=f"{_name(replica)} reports no weight checksums")
        if sharded := next((holder for holder in served if holder.tp_size != 1), None):
            return WeightsVerdict(unavailable=f"{sharded.holder} holds tensor-parallel shards")
        for holder in served:
            layout = tuple(sorted((k, tuple(v)) for k, v in holder.layout.items()))
            if layout not in expected_by_layout:
                expected_by_layout[layout] = await asyncio.to_thread(trainer.weight_checksums, dict(layout))
            expected = expected_by_layout[layout]
            wrong = [
                name
                for name, (_, sums) in expected.items()
                if name in holder.checksums and holder.checksums[name] not in sums
            ]
            if wrong:
                listed = ", ".join(_with_parts(name, expected[name][0]) for name in wrong[:5])
                more = f" and {len(wrong) - 5} more" if len(wrong) > 5 else ""
                raise WeightSyncError(
                    f"trust check failed after weight sync {weight_version}: {holder.holder} holds other "
                    f"values than the trainer for {len(wrong)} of {len(expected)} tensors ({listed}{more}; "
                    "compared by checksum): part of the weights did not reach the engine"
                )
            missing = [name for name in expected if name not in holder.checksums]
            verdict.unverified = sorted({*verdict.unverified, *(p for n in missing for p in expected[n][0])})
            compared = len(expected) - len(missing)
            verdict.tensors = compared if verdict.tensors < 0 else min(verdict.tensors, compared)
    verdict.tensors = max(verdict.tensors, 0)
    return verdict


def _with_parts(name: str, parts: list[str]) -> str:
    if parts == [name]:
        return name
    return f"{name} (the trainer's {', '.join(p.rsplit('.', 2)[-2] for p in parts)})"


def _name(replica: InferenceEngine) -> str:
    return getattr(replica, "name", None) or type(replica).__name__


def describe_stale(stale: list[tuple[str, str]], weight_version: int) -> str:
    return ", ".join(f"{name} serves weight version {served!r}" for name, served in stale) + (
        f" where {weight_version!r} is due"
    )
