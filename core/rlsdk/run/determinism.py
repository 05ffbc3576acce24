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
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..config import RolloutConfig
from ..runtime import Runtime
from ..training.seeds import restored_afterwards, seed_everything
from ..training_options import overlapped
from .output import RunOutput

REPORT_FILE = "determinism.json"
"""What the check found, written to the output folder of a deterministic run."""


KERNEL_ALERT = re.compile(
    r"(\S.*?) (?:does not have a deterministic implementation|defaults to a non-deterministic)"
)
"""How torch words a kernel that ran without a deterministic implementation while its deterministic algorithms
are on with ``warn_only`` (``index_add_cuda_ does not have ...``, ``Memory Efficient attention defaults to a
non-deterministic algorithm``): group 1 names the kernel."""


class NondeterminismWarning(RuntimeWarning):
    """A part of a ``--deterministic`` run whose results may differ between two runs with the same seeds."""


@dataclass(frozen=True)
class Part:
    """A part of a run that is not deterministic, and why."""

    part: str
    why: str


@contextmanager
def deterministic_run(args: RolloutConfig, output: RunOutput) -> Iterator[None]:
    """In deterministic mode, before the engine and the trainer draw from any generator: every generator
    seeded, torch's deterministic algorithms on, the wall-clock figures kept apart from ``metrics.jsonl``;
    the process's generators and torch's switches as they were once the run ends; the kernels torch ran
    without a deterministic implementation meanwhile named in the check (:func:`naming_kernels`)."""
    if not args.sglang_enable_deterministic_inference:
        yield
        return
    with restored_afterwards(), naming_kernels(args, output.folder):
        seed_everything(args.rollout_seed)
        output.timings_apart = True
        yield


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
    warn_parts(parts)
    write_report(args, folder, parts)
    return parts


def warn_parts(parts: list[Part]) -> None:
    for part in parts:
        warnings.warn(
            f"--deterministic: {part.part} is not deterministic: {part.why}",
            NondeterminismWarning,
            stacklevel=3,
        )


def write_report(args: RolloutConfig, folder: Path, parts: list[Part]) -> None:
    report = {
        "deterministic": not parts,
        "rollout_seed": args.rollout_seed,
        "not_deterministic": [asdict(p) for p in parts],
    }
    (folder / REPORT_FILE).write_text(json.dumps(report, indent=1) + "\n")


@contextmanager
def naming_kernels(args: RolloutConfig, folder: Path) -> Iterator[None]:
    """The kernels torch ran without a deterministic implementation in the block (in this process: the
    driver's and a colocated trainer's), each warned about and added to ``determinism.json`` when it ends.
    Torch says so once per process and goes on."""
    kernels: list[str] = []
    shown = warnings.showwarning

    def seeing(message: Any, *rest: Any, **named: Any) -> None:
        found = KERNEL_ALERT.match(str(message))
        if found and found.group(1) not in kernels:
            kernels.append(found.group(1))
        shown(message, *rest, **named)

    warnings.showwarning = seeing
    try:
        yield
    finally:
        warnings.showwarning = shown
        if kernels and (folder / REPORT_FILE).exists():
            found = [
                Part(
                    f"kernel {kernel!r}",
                    "torch ran it without a deterministic implementation (it only warns)",
                )
                for kernel in kernels
            ]
            warn_parts(found)
            known = json.loads((folder / REPORT_FILE).read_text())["not_deterministic"]
            write_report(args, folder, [Part(**part) for part in known] + found)
