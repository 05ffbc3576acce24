"""The training half of ``rlsdk run --train``: after each rollout step, train, sync, check, checkpoint."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

from ..config import RolloutConfig
from ..engines.protocol import EngineError
from ..runtime import Runtime
from ..state_files import read_json, signed, signed_here
from ..training_options import offloads
from ..types import RolloutFnTrainOutput, Sample
from .distillation import open_teacher, score_with_teacher
from .gpu_memory import phase_peaks_for
from .sync import (
    SyncTimes,
    WeightSyncError,
    WeightSyncTimeout,
    check_tolerance,
    choose_sync,
    default_sync_timeout,
    engine_label,
    sync_weights,
    trains_on_gpu,
    trust_check,
)
from .trainer import PolicyTrainer, build_trainer
from .trust import DriftCheck, WeightsVerdict, check_weights, describe_stale, pick_probes, stale_replicas
from ..plugins.kinds import Trainer, UpdateWeightPostWrite

CHECKPOINT_META = "rlsdk_checkpoint.json"
log = logging.getLogger(__name__)


def checkpoint_settings(folder: Path) -> dict[str, Any] | None:
    """The settings of the run that wrote the checkpoint ``folder``; None where it is not one of rlsdk's."""
    meta = folder / CHECKPOINT_META
    if not meta.is_file():
        return None
    settings = read_json(meta).get("settings")
    return dict(settings) if isinstance(settings, dict) else {}


def checkpoint_signed_here(folder: Path) -> bool:
    """Whether rlsdk on this machine wrote the checkpoint ``folder``'s settings as they are (its signature)."""
    meta = folder / CHECKPOINT_META
    return meta.is_file() and signed_here(read_json(meta))


def checkpoint_root(args: RolloutConfig, output_folder: Path) -> Path:
    """Where a run writes its checkpoints (``step_N/``): ``--save``, else ``<output_dir>/checkpoints``."""
    return Path(args.save) if args.save else output_folder / "checkpoints"


def prune_checkpoints(root: Path, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` checkpoints (``step_N/`` by N) under ``root``; returns those removed."""
    steps = sorted(
        (p for p in root.glob("step_*") if p.is_dir() and p.name[5:].isdigit()), key=lambda p: int(p.name[5:])
    )
    removed = steps[: max(len(steps) - keep, 0)]
    for folder in removed:
        shutil.rmtree(folder)
    return removed


def weights_check_on(args: RolloutConfig, trainer: PolicyTrainer) -> bool:
    """``weights_check``: ``auto`` is on with the trainer on CUDA; a LoRA run has no use for it (the engine
    serves the adapter beside the weights it compares)."""
    if getattr(args, "lora_rank", 0):
        return False
    return args.weights_check == "on" or (args.weights_check == "auto" and trains_on_gpu(trainer))


class TrainingSession:
    """The run's trainer, the engine's weight version, and the checkpoints.

    ``weight_version`` counts syncs: the engine starts at ``0`` (the starting weights) and serves version
    ``n`` after the n-th train step, so each sample's ``weight_versions`` say which policy sampled it.
    """

    def __init__(self, args: RolloutConfig, runtime: Runtime, output_folder: Path) -> None:
        self.args = args
        self.runtime = runtime
        self.output_folder = output_folder
        self.weight_sync = choose_sync(  # before any model loads
            args,
            runtime.engine,
            output_folder / "sync-weights",
            runtime.plugins.get(UpdateWeightPostWrite),  # update_weight_post_write: called by the disk sync
        )
        trainer = runtime.plugins.get(Trainer)
        assert trainer is not None, "a training run resolves its trainer"
        # trainer: built by its plugin from the run's settings
        self.trainer: PolicyTrainer = build_trainer(trainer, args)
        self.weight_version = 0
        self.drift = DriftCheck()
        self.weights_check = weights_check_on(args, self.trainer)
        self._said_partial = False
        self.sync_timeout = default_sync_timeout(args)
        self.sync_times = SyncTimes()
        self.offload_train = offloads(args)[0] and bool(getattr(args, "colocate", False))
        self.memory = phase_peaks_for(self.trainer)
        if self.offload_train:  # the engines generate first
            self.trainer.offload()
        self.teacher = None
        if args.opd_teacher:  # on-policy distillation: the teacher scores every kept sample
            self.teacher = open_teacher(args, runtime.pm)
            runtime.run(self.teacher.start())

    @property
    def checkpoint_root(self) -> Path:
        return checkpoint_root(self.args, self.output_folder)

    def sync(self) -> dict[str, float]:
        """The trainer's weights to the engine as the current ``weight_version``, within the sync timeout;
        a sync more than twice as slow as the run's median is a warning."""
        try:
            seconds = self.runtime.run(
                sync_weights(
                    self.runtime.engine,
                    self.trainer,
                    str(self.weight_version),
                    self.weight_sync,
                    self.sync_timeout,
                )
            )
        except WeightSyncTimeout as exc:
            raise WeightSyncTimeout(f"{exc}; the run stops. {self._restart_hint()}") from None
        except EngineError as exc:  # the engine died or refused during the sync
            raise WeightSyncError(
                f"the weight sync of version {self.weight_version} to {engine_label(self.runtime.engine)} over "
                f"the {self.weight_sync.name} transport failed: {exc}; the run stops. {self._restart_hint()}"
            ) from None
        grew = self.sync_times.add(seconds, self.weight_sync.name)
        if grew:
            warnings.warn(grew, RuntimeWarning, stacklevel=2)
        parts = {f"train/sync_{part}": value for part, value in self.weight_sync.timings.items()}
        return {"train/sync_seconds": seconds, **parts, "train/weight_version": self.weight_version}

    def _restart_hint(self) -> str:
        return f"Restart or replace the engine, then continue with: rlsdk run --resume --output {self.output_folder}"

    def ensure_engine_weights(self) -> int:
        """The weight-version handshake before a step generates (T21): an engine that serves another
        version than the trainer's (restarted since the last sync) gets the weights again; the number of
        engines that needed it. Still stale after that: :class:`WeightSyncError`."""
        stale = self.stale_engines(self.weight_version)
        if not stale:
            return 0
        log.warning(
            "%s: syncing the weights again before the step", describe_stale(stale, self.weight_version)
        )
        self.sync()
        still = self.stale_engines(self.weight_version)
        if still:
            raise WeightSyncError(
                f"{describe_stale(still, self.weight_version)}, even after a new weight sync"
            )
        return len(stale)

    def train(self, rollout_id: int, result: RolloutFnTrainOutput) -> dict[str, Any]:
        """One train step on the kept groups (the loop's train verb; :meth:`publish` syncs). Before it, the
        engine must still serve the weights the step was sampled under (T21), and the drift check's baseline
        is measured once while both hold the same weights."""
        if result.samples:
            stale = self.stale_engines(self.weight_version)
            if stale:  # restarted during the step: its samples may come from other weights
                raise WeightSyncError(
                    f"step {rollout_id}: {describe_stale(stale, self.weight_version)}: the engine lost the "
                    "trainer's weights during the step (restarted?), so its samples are not trained on; "
                    "--resume continues from the last checkpoint"
                )
        self.measure_noise(pick_probes(result.samples))
        return self.train_step(rollout_id, result)

    def publish(self, result: RolloutFnTrainOutput) -> dict[str, Any]:
        """The new weights to every engine, then the trust checks on the step's samples (the loop's sync verb):
        the probe's largest gap, and the mean gap of several probes against this run's own noise
        (:class:`~.trust.DriftCheck`)."""
        with self._phase("sync"):
            metrics = self.sync()
            metrics.update(self.check(result.samples[-1][0], pick_probes(result.samples)))
        if self.memory is not None:
            peaks = self.memory.take()
            metrics.update({f"memory/peak_gpu_gb_{phase}": gb for phase, gb in peaks.items()})
        return metrics

    def stale_engines(self, version: int) -> list[tuple[str, str]]:
        """(engine, version it serves) of each engine not serving weight version ``version``."""
        return self.runtime.run(stale_replicas(self.runtime.engine, version))

    def measure_noise(self, probes: list[Sample]) -> None:
        """The drift check's baseline, once: the probes' mean gap while the engines and the trainer hold
        the same weights (the caller makes sure they do), the pair's own numeric noise."""
        if self.drift.baseline is None and probes:
            self.drift.set_baseline(
                self.runtime.run(self.drift.measure(self.runtime.engine, self.trainer, probes))
            )

    def train_step(self, rollout_id: int, result: RolloutFnTrainOutput) -> dict[str, Any]:
        """One train step on the kept groups (no sync): the trainer's ``weight_version`` goes up by one."""
        if not result.samples:
            raise RuntimeError(f"step {rollout_id} kept no samples: nothing to train on")
        teacher_seconds = None
        if self.teacher is not None:
            started = time.perf_counter()
            self.runtime.run(score_with_teacher(self.teacher, [s for g in result.samples for s in g]))
            teacher_seconds = time.perf_counter() - started
        with self._phase("train"):
            self.runtime.run(self.weight_sync.before_train(self.runtime.engine))  # offload_rollout
            if self.offload_train:
                self.trainer.onload()
            metrics = self.trainer.train_step(rollout_id, result.samples)
            if self.offload_train:  # before the engines take their memory back
                started = time.perf_counter()
                self.trainer.offload()
                metrics["train/offload_seconds"] = time.perf_counter() - started
        if teacher_seconds is not None:
            metrics["train/opd_teacher_seconds"] = teacher_seconds
        self.weight_version += 1
        return sampler_gap_means(metrics)

    def check(self, probe: Sample, probes: list[Sample] | None = None) -> dict[str, float]:
        """The trust check after a sync: with ``weights_check``, every tensor by checksum; the engine's
        log-probs of ``probe`` against the trainer's, and with ``probes`` (once the run's noise is measured)
        their mean per-token gap against that noise. Where the checksums verified every tensor, the gaps
        are recorded but stop nothing (they are numeric noise)."""
        started = time.perf_counter()
        metrics: dict[str, float] = {}
        exact = False
        if self.weights_check:
            verdict = self.runtime.run(check_weights(self.runtime.engine, self.trainer, self.weight_version))
            self._say_partial(verdict)
            exact = verdict.complete
            metrics["train/weights_checked"] = verdict.tensors
            metrics["train/weights_check_seconds"] = time.perf_counter() - started
        tolerance = check_tolerance(self.args, self.trainer)
        diff = self.runtime.run(
            trust_check(self.runtime.engine, self.trainer, probe, tolerance, enforce=not exact)
        )
        metrics["train/sync_logprob_max_diff"] = diff
        if probes and self.drift.baseline is not None:
            means = self.runtime.run(self.drift.measure(self.runtime.engine, self.trainer, probes))
            mean = max(means, default=0.0) if exact else self.drift.check(means, self.weight_version)
            metrics["train/sync_logprob_mean_diff"] = mean
            metrics["train/sync_logprob_noise"] = self.drift.baseline
        metrics["train/trust_check_seconds"] = time.perf_counter() - started
        return metrics

    def _say_partial(self, verdict: WeightsVerdict) -> None:
        """Once a run: the weights check could not compare every tensor, and why."""
        if verdict.complete or self._said_partial:
            return
        self._said_partial = True
        why = verdict.unavailable or (
            f"no engine reports {', '.join(verdict.unverified[:3])}"
            + (f" and {len(verdict.unverified) - 3} more" if len(verdict.unverified) > 3 else "")
            + " under the names its layout gives"
        )
        log.warning("weights check: %s; those tensors are checked through log-probs only", why)

    def checkpoint_due(self, rollout_id: int) -> bool:
        last = rollout_id + 1 == self.args.num_rollout
        interval = self.args.save_interval
        return last or bool(interval and (rollout_id + 1) % interval == 0)

    def save(self, rollout_id: int, run_state: dict[str, Any]) -> Path:
        """Write ``step_<rollout_id>/`` (model in Hugging Face format, optimizer, random states) with the
        run's state beside it; written to a temporary folder and renamed, so a crash leaves none half-done."""
        root = self.checkpoint_root
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"step_{rollout_id}"
        staging = root / f".step_{rollout_id}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        self.trainer.save_checkpoint(staging)
        meta = {"rollout_id": rollout_id, "weight_version": self.weight_version, **run_state}
        (staging / CHECKPOINT_META).write_text(json.dumps(signed(meta)))
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
        if self.args.keep_last_n:
            prune_checkpoints(root, self.args.keep_last_n)
        return final

    def _phase(self, name: str) -> Any:
        return self.memory.phase(name) if self.memory is not None else contextlib.nullcontext()

    def close(self) -> None:
        if self.memory is not None:
            self.memory.close()
        try:
            self.trainer.close()
        finally:
            if self.teacher is not None:
                self.runtime.run(self.teacher.close())

    def restore(self, folder: Path) -> None:
        """Load a checkpoint into the trainer and hand its weights to the engine."""
        meta = read_json(folder / CHECKPOINT_META, "weight_version")
        self.trainer.load_checkpoint(folder)
        if self.offload_train:  # the optimizer state came back to the GPU; the engines generate next
            self.trainer.offload()
        self.weight_version = int(meta["weight_version"])
        self.sync()


GAP_SUMS = ("train/train_rollout_logprob_abs_diff", "train/rollout_kl", "train/rollout_tokens_over_gap")


def sampler_gap_means(metrics: dict[str, Any]) -> dict[str, Any]:
    """The loss's sampler-trainer gap sums (:func:`~.losses.sampler_gap`) as means over the samples the
    trainer's weights sampled: ``train/rollout_logprob_diff``, ``train/rollout_kl``,
    ``train/rollout_tokens_over_gap``, with ``train/rollout_gap_excluded`` the share left out (continued
    after a weight sync, kept from a step before, or with no token in the loss); none where every sample
    was left out."""
    judged = metrics.pop("train/rollout_gap_judged", None)
    if judged is not None:  # rlsdk's policy loss; another loss's gap (slime's name) is taken as it is
        sums = {key: metrics.pop(key) for key in GAP_SUMS if key in metrics}
        metrics["train/rollout_gap_excluded"] = max(0.0, 1.0 - judged)
        if judged > 0:
            metrics.update({key: value / judged for key, value in sums.items()})
    if "train/train_rollout_logprob_abs_diff" in metrics:
        metrics["train/rollout_logprob_diff"] = metrics.pop("train/train_rollout_logprob_abs_diff")
    return metrics
