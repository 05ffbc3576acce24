"""Deterministic mode: do two runs of the quick start with the same seed write the same ``metrics.jsonl``, and
what does ``--deterministic`` cost in steps per minute?

Runs the quick start (``rlsdk run --train``: GRPO on SmolLM2-135M-Instruct over the shipped arithmetic set)
three times in subprocesses, exactly as a user types it: twice with ``--deterministic``, once without (the
baseline, measured in the same invocation). Compares the two deterministic runs' ``metrics.jsonl`` and
``eval.jsonl`` byte for byte, and reports the first line that differs where they do. Steps per minute are
counted over the steps alone (``run/elapsed_seconds`` of the last step: from the first step's start, the
model's loading left out). ``ratio`` is the deterministic runs' mean steps per minute over the default run's
(the cost: below 1 means slower).

It shows that what it measures happened: each run did every step (exit 0, one metrics row a step), the
rewards changed from step to step (the steps sampled different things), and each deterministic run's check
(``determinism.json``) found no part of the run non-deterministic.

    python benchmarks/determinism.py [--num-rollout 20] [--save results/determinism-CARD.json]
                                     [rlsdk run options, e.g. --rollout-batch-size 2]
    python benchmarks/determinism.py --compare RUN_A RUN_B   # two finished runs' folders (the GPU phase's)
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
from typing import Any

from harness import machine

RUN_TRAIN = [sys.executable, "-m", "rlsdk_cli.app", "run", "--train"]


def run(out: Path, deterministic: bool, options: list[str]) -> dict[str, Any]:
    """One quick-start run into ``out``; its exit code, wall time and steps per minute."""
    command = [*RUN_TRAIN, "--output", str(out), *(["--deterministic"] if deterministic else []), *options]
    print(" ".join(command), file=sys.stderr, flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, stdout=sys.stderr, stderr=sys.stderr, check=False)
    wall = time.perf_counter() - started
    timings = out / ("timings.jsonl" if deterministic else "metrics.jsonl")
    elapsed = [row["run/elapsed_seconds"] for row in rows(timings) if "run/elapsed_seconds" in row]
    steps = rows(out / "metrics.jsonl")
    return {
        "deterministic": deterministic,
        "exit_code": done.returncode,
        "steps": len(steps),
        "wall_seconds": round(wall, 1),
        "step_seconds": round(elapsed[-1], 1) if elapsed else None,
        "steps_per_minute": round(len(steps) / (elapsed[-1] / 60), 3) if elapsed else None,
        "reward_curve": [row.get("rollout/reward_mean") for row in steps],
        "check": json.loads((out / "determinism.json").read_text()) if deterministic else None,
    }


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def first_difference(a: Path, b: Path) -> dict[str, Any] | None:
    """The first line where two files differ (its number and both texts, cut), or None when they are equal."""
    if not a.exists() or not b.exists():  # neither written (no eval) is no difference
        return (
            None
            if a.exists() == b.exists()
            else {"line": 0, "a": f"exists: {a.exists()}", "b": f"exists: {b.exists()}"}
        )
    left, right = a.read_bytes().splitlines(), b.read_bytes().splitlines()
    for number, (x, y) in enumerate(zip(left, right), 1):
        if x != y:
            return {"line": number, "a": x[:300].decode(), "b": y[:300].decode()}
    if len(left) != len(right):
        return {"line": min(len(left), len(right)) + 1, "a": f"{len(left)} lines", "b": f"{len(right)} lines"}
    return None


def compare(a: Path, b: Path) -> dict[str, Any]:
    """Two finished runs' folders: their reward curves, files and checks side by side."""
    curves = [[row.get("rollout/reward_mean") for row in rows(run / "metrics.jsonl")] for run in (a, b)]
    checks = [
        json.loads((run / "determinism.json").read_text()) if (run / "determinism.json").exists() else None
        for run in (a, b)
    ]
    return {
        "benchmark": "determinism",
        "machine": machine(),
        "runs": [str(a), str(b)],
        "steps": [len(curve) for curve in curves],
        "identical_reward_curves": curves[0] == curves[1] and bool(curves[0]),
        "reward_curves": curves,
        "first_differences": {
            name: first_difference(a / name, b / name) for name in ("metrics.jsonl", "eval.jsonl")
        },
        "checks": checks,
    }


def main() -> None:
    if sys.argv[1:2] == ["--compare"]:
        print(json.dumps(compare(Path(sys.argv[2]), Path(sys.argv[3]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-rollout", type=int, default=20, help="steps per run (the issue's 20)")
    parser.add_argument("--save", type=Path, default=None, help="also write the JSON report to this file")
    parser.add_argument("--card", default=None, help="the machine's name in the report (cpu2, h200, ...)")
    opts, unknown = parser.parse_known_args()
    options = ["--num-rollout", str(opts.num_rollout), *(arg for arg in unknown if arg != "--")]
    base = Path(tempfile.mkdtemp(prefix="rlsdk-determinism-"))
    load_before = os.getloadavg()
    first = run(base / "deterministic-a", True, options)
    second = run(base / "deterministic-b", True, options)
    default = run(base / "default", False, options)
    differences = {
        name: first_difference(base / "deterministic-a" / name, base / "deterministic-b" / name)
        for name in ("metrics.jsonl", "eval.jsonl")
    }
    ran = all(r["exit_code"] == 0 and r["steps"] == opts.num_rollout for r in (first, second, default))
    rewards = [r for r in first["reward_curve"] if r is not None]
    deterministic_rate = (
        (first["steps_per_minute"] + second["steps_per_minute"]) / 2
        if first["steps_per_minute"] and second["steps_per_minute"]
        else None
    )
    report = {
        "benchmark": "determinism",
        "card": opts.card,
        "machine": {**machine(), "load_average_before": load_before, "load_average_after": os.getloadavg()},
        "run_options": options,
        "identical_metrics": differences["metrics.jsonl"] is None and ran,
        "identical_eval": differences["eval.jsonl"] is None and ran,
        "first_differences": differences,
        "all_steps_ran": ran,
        "rewards_changed": len(set(rewards)) > 1,
        "checks_found_nothing": all(r["check"] and r["check"]["deterministic"] for r in (first, second)),
        "deterministic_steps_per_minute": deterministic_rate,
        "default_steps_per_minute": default["steps_per_minute"],
        "ratio": round(deterministic_rate / default["steps_per_minute"], 3)
        if deterministic_rate and default["steps_per_minute"]
        else None,
        "runs": {"deterministic_a": first, "deterministic_b": second, "default": default},
        "folder": str(base),
    }
    if opts.save:
        opts.save.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
