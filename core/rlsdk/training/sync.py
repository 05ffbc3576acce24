"""Weight sync from the trainer to the engine, and the trust check that follows every sync.

An engine in this process (the embedded engine) takes the trainer's tensors directly; any other engine
(an SGLang server) loads a Hugging Face folder the trainer writes, through ``/update_weights_from_disk``.
The trust check then asks the engine for the log-probs of a probe sample's response tokens (SGLang's
``logprob_start_len`` with ``max_new_tokens: 0``) and compares them with the trainer's.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..engine import InferenceEngine
from ..errors import RlsdkError
from ..types import Sample
from .trainer import PolicyTrainer


class WeightSyncError(RlsdkError):
    """The engine serves other weights than the trainer's (the trust check failed)."""


async def sync_weights(engine: InferenceEngine, trainer: PolicyTrainer, weight_version: str,
                       disk_folder: Path) -> float:
    """Give the engine the trainer's weights as ``weight_version``; returns the seconds it took."""
    started = time.perf_counter()
    if engine.in_process_weights:
        await engine.pause("in_place")
        try:
            await engine.update_weights(trainer.weights(), weight_version)
            await engine.flush_cache()
        finally:
            await engine.resume()
    else:
        staging = disk_folder.with_name(disk_folder.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        await asyncio.to_thread(trainer.save_hf_model, staging)
        shutil.rmtree(disk_folder, ignore_errors=True)
        staging.rename(disk_folder)
        await engine.update_weights_from_disk(str(disk_folder.resolve()), weight_version)
    return time.perf_counter() - started


async def engine_log_probs(engine: InferenceEngine, sample: Sample) -> list[float]:
    """The engine's log-probs (temperature 1) of ``sample``'s response tokens under its current weights."""
    payload = {"input_ids": list(sample.tokens), "return_logprob": True, "logprob_start_len": sample.prompt_length,
               "sampling_params": {"max_new_tokens": 0, "temperature": 1.0}}
    response = await engine.generate(payload)
    assert isinstance(response, dict)
    entries = response.get("meta_info", {}).get("input_token_logprobs") or []
    if len(entries) != sample.response_length:
        raise WeightSyncError(f"trust check: the engine returned {len(entries)} prompt log-probs for a probe of "
                              f"{sample.response_length} response tokens (does it support logprob_start_len?)")
    return [float(entry[0]) for entry in entries]


@dataclass
class TrustProbe:
    """A probe sample with the trainer's log-probs of its response under the weights just synced: every
    engine serving those weights must give the same within ``tolerance``. An engine pool keeps the last
    one passed, to check an engine it restarts before it rejoins."""

    sample: Sample
    expected: list[float]
    tolerance: float

    async def check(self, engine: InferenceEngine) -> float:
        """The largest |engine - trainer| log-prob; above the tolerance a :class:`WeightSyncError`."""
        if self.sample.response_length == 0:
            return 0.0
        served = await engine_log_probs(engine, self.sample)
        diff = max(abs(a - b) for a, b in zip(served, self.expected, strict=True))
        if not diff <= self.tolerance:
            probe, name = self.sample, getattr(engine, "name", "the engine")
            raise WeightSyncError(
                f"trust check failed after the weight sync: {name}'s log-probs for a probe sample (group "
                f"{probe.group_index}, index {probe.index}, {probe.response_length} response tokens) differ "
                f"from the trainer's by up to {diff:.4g} nats (tolerance --sync-check-tol {self.tolerance}): "
                "the engine is serving other weights than the trainer's")
        return diff


async def trust_check(engine: InferenceEngine, trainer: PolicyTrainer, probe: Sample, tolerance: float) -> float:
    """The largest |engine - trainer| log-prob over ``probe``'s response tokens, for each of the engine's
    replicas; above ``tolerance`` a :class:`WeightSyncError`."""
    expected = []
    if probe.response_length:
        expected = (await asyncio.to_thread(trainer.response_log_probs, [probe]))[0]
    checked = TrustProbe(probe, expected, tolerance)
    diff = max([await checked.check(replica) for replica in engine.replicas()], default=0.0)
    engine.remember_trust_probe(checked)
    return diff
