"""Learning: does ``rlsdk run --train`` (the default demo) raise the reward on problems it never saw?

Runs the default demo in a subprocess, exactly as a user types it (GRPO on SmolLM2-135M-Instruct over
the shipped single-digit arithmetic training file, evaluated on the disjoint eval file), optionally
pinned to ``--cores`` CPU cores. The baseline is the same run's own starting point: the eval before the
first step. Reports the held-out mean sampled reward (temperature 1) at the start and the end, the
minutes the run took, the peak memory of the process and the slowest weight sync.

Targets on 2 CPU cores: ``heldout_reward_end >= 0.9`` within 15 minutes, peak memory <= 6 GB, every
weight sync <= 0.5 s.

    python benchmarks/learning.py [--cores 2] [--async] [--output DIR] [rlsdk run options, e.g.
                                  --advantage-estimator ppo, or --lora-rank 16 --lr 1e-4]

``--async`` runs the demo with ``rlsdk run --async`` (the next rollout generates while the trainer trains);
the targets stay the same (the overlap gains little on 2 shared cores: docs/async.md). Any other option this
script does not know goes to ``rlsdk run`` (after ``--`` too); the report's ``run_options`` lists them, so
one file per algorithm compares against GRPO's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import machine

TARGETS = {"heldout_reward_end": 0.9, "minutes": 15.0, "peak_rss_gb": 6.0, "sync_seconds_max": 0.5}



RUN_TRAIN = [sys.executable, "-m", "rlsdk_cli.app", "run", "--train"]
"""``rlsdk run --train`` in this interpreter: the command every learning benchmark starts from."""

def rows(path: Path) -> list[dict]:
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def heldout_curve(evals: list[dict]) -> list[tuple[int, float]]:
    """``(rollout_id, mean sampled reward)`` of each eval in ``eval.jsonl`` (the first eval set's)."""
    key = next((k for row in evals for k in row if k.endswith("/reward_mean")), None)
    return [(row["rollout_id"], round(row[key], 4)) for row in evals if key in row] if key else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores", type=int, default=2, help="CPU cores to pin the run to (0: no pinning)")
    parser.add_argument(
        "--output", type=Path, default=None, help="the run's output folder (default a temporary one)"
    )
    parser.add_argument("--async", dest="async_", action="store_true", help="rlsdk run --async")
    opts, unknown = parser.parse_known_args()
    extra = [arg for arg in unknown if arg != "--"]
    out = opts.output or Path(tempfile.mkdtemp(prefix="rlsdk-learning-"))
    command = [*RUN_TRAIN, "--output", str(out), *(["--async"] if opts.async_ else []), *extra]
    cores = sorted(os.sched_getaffinity(0))[: opts.cores] if opts.cores else None
    started = time.perf_counter()
    done = subprocess.run(
        command,
        preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
        stdout=sys.stderr,
        stderr=sys.stderr,
        check=False,
    )
    minutes = (time.perf_counter() - started) / 60
    steps, evals = rows(out / "metrics.jsonl"), rows(out / "eval.jsonl")
    curve = heldout_curve(evals)
    report = {
        "benchmark": "learning",
        "machine": machine(),
        "cores": len(cores) if cores else os.cpu_count(),
        "mode": "async" if opts.async_ else "sync",
        "run_options": extra,
        "exit_code": done.returncode,
        "steps": len(steps),
        "heldout_reward_start": curve[0][1] if curve else None,
        "heldout_reward_end": curve[-1][1] if curve else None,
        "heldout_curve": curve,
        "train_reward_curve": [
            (row["rollout_id"], round(row["rollout/reward_mean"], 4))
            for row in steps
            if row.get("rollout/reward_mean") is not None
        ],
        "minutes": minutes,
        "peak_rss_gb": max((row.get("train/peak_memory_gb", 0.0) for row in steps), default=None),
        "sync_seconds_max": max((row.get("train/sync_seconds", 0.0) for row in steps), default=None),
        "curves": str(out / "curves.png"),
    }
    checks = [
        report[name] is not None
        and (report[name] >= target if name == "heldout_reward_end" else report[name] <= target)
        for name, target in TARGETS.items()
    ]
    report["targets"] = TARGETS
    report["meets_target"] = done.returncode == 0 and all(checks)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
