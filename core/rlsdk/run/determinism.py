"""Deterministic mode (``--deterministic``, slime's ``--sglang-enable-deterministic-inference``): every random
choice seeded, deterministic kernels where the engine and the trainer offer them, and a check that names each
part of the run that stays non-deterministic, and why.

Seeded: the data order (``rollout_shuffle``: ``rollout_seed`` and the epoch), each sample's sampling
(``sampling_seed`` ``rollout_seed + i`` for sample ``i`` of a group), Python's, NumPy's and torch's
generators (dropout, random filters and rewards) from ``rollout_seed``. Deterministic kernels: torch's
deterministic algorithms (cuDNN's too, cuBLAS's workspace fixed), the embedded engine one request at a time,
SGLang's batch-invariant kernels (``--enable-deterministic-inference``, passed to the servers rlsdk
launches). Wall-clock figures (seconds, rates, peak memory) differ between any two runs: they go to
``timings.jsonl``, so ``metrics.jsonl`` holds only what the seeds decide.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import RolloutConfig
from ..runtime import Runtime
from ..training.seeds import seed_everything
from ..training_options import overlapped
from .output import RunOutput

REPORT_FILE = "determinism.json"
"""What the check found, written to the output folder of a deterministic run."""


class NondeterminismWarning(RuntimeWarning):
    """A part of a ``--deterministic`` run whose results may differ between two runs with the same seeds."""


@dataclass(frozen=True)
class Part:
    """A part of a run that is not deterministic, and why."""

    part: str
    why: str


def start_deterministic(args: RolloutConfig, output: RunOutput) -> None:
    """In deterministic mode, before the engine and the trainer draw from any generator: every generator
    seeded, torch's deterministic algorithms on, the wall-clock figures kept apart from ``metrics.jsonl``."""
    if args.sglang_enable_deterministic_inference:
        seed_everything(args.rollout_seed)
        output.timings_apart = True


def nondeterministic_parts(args: RolloutConfig, runtime: Runtime) -> list[Part]:
    """The parts of this run whose results may differ between two runs with the same seeds, each with why."""
    parts = []
    engine = runtime.run(runtime.engine.nondeterminism())
    if engine is not None:
        parts.append(Part(f"engine {args.choices['engine']!r}", engine))
    if args.train and overlapped(args):
        parts.append(
            Part(
                "--async / --max-policy-version-lag",
                "which policy version samples each group depends on how generation and training overlap in time",
            )
        )
    if args.partial_rollout:
        parts.append(
            Part(
                "--partial-rollout",
                "which samples are unfinished at the end of a step (and resumed later) depends on timing",
            )
        )
    dynamic_filter = args.choices.get("dynamic_sampling_filter_path")
    surplus = (args.over_sampling_batch_size or args.rollout_batch_size) > args.rollout_batch_size
    if dynamic_filter or surplus:
        given = f"--dynamic-filter {dynamic_filter}" if dynamic_filter else "--over-sampling-batch-size"
        parts.append(
            Part(
                given,
                "a step keeps the groups that finish first once it has enough; which those are depends on timing",
            )
        )
    if args.train and args.choices.get("trainer") != "torch":
        parts.append(
            Part(
                f"trainer {args.choices.get('trainer')!r}",
                "rlsdk seeds the driver's generators and turns on torch's deterministic algorithms in it; the "
                "trainer's own processes and kernels are the trainer's to make deterministic",
            )
        )
    return parts


def report_nondeterminism(args: RolloutConfig, runtime: Runtime, folder: Path) -> list[Part]:
    """Warn once per part of a deterministic run that is not deterministic, and write them all to
    ``determinism.json`` in the run's folder."""
    parts = nondeterministic_parts(args, runtime)
    for part in parts:
        warnings.warn(
            f"--deterministic: {part.part} is not deterministic: {part.why}",
            NondeterminismWarning,
            stacklevel=2,
        )
    report = {
        "deterministic": not parts,
        "rollout_seed": args.rollout_seed,
        "not_deterministic": [asdict(p) for p in parts],
    }
    (folder / REPORT_FILE).write_text(json.dumps(report, indent=1) + "\n")
    return parts
