"""Synchronous against ``--async`` (and ``--max-policy-version-lag``) training: the targets of issue 38,
from the JSON lines of ``learning_gpu.py`` runs (``device.sh learn_sync_ray``, ``learn_async_ray``,
``learn_lag2_ray``). Runs anywhere (no GPU); the last line printed is one JSON object; the curves of every
run on one plot.

- ideal overlap: the synchronous run's own parts give the step an overlap could reach, ``max(rollout,
  train) + sync`` (medians); target: ``--async`` runs at least 90% of the ideal's steps per minute;
- speed-up: ``--async`` steps per minute at least 1.3x the synchronous run's;
- learning: the held-out reward of ``--async`` after the same wall-clock minutes (the last eval both runs
  reached) at least the synchronous run's.

    python benchmarks/gpu/async_compare.py OUT/learning_gpu_sync.json OUT/learning_gpu_async.json \\
        [OUT/learning_gpu_lag2.json ...] --output benchmarks/results/async_gpu-h100
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

TARGETS = {"ideal_fraction": 0.9, "speedup": 1.3}


def last_json(path: Path) -> dict[str, Any]:
    lines = [line for line in path.read_text().splitlines() if line.strip().startswith("{")]
    return json.loads(lines[-1])


def reward_at(curve: list[list[float]], minutes: float) -> float | None:
    """The held-out reward of the last eval at or before ``minutes``."""
    reached = [reward for at, reward in curve if at <= minutes + 1e-9]
    return reached[-1] if reached else None


def compare(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by_mode = {run["mode"]: run for run in runs}
    sync, overlapped = by_mode.get("sync"), by_mode.get("async")
    report: dict[str, Any] = {
        "benchmark": "async_compare",
        "runs": {
            run["mode"]: {
                key: run.get(key)
                for key in (
                    "steps",
                    "minutes",
                    "response_len",
                    "steps_per_minute",
                    "samples_per_minute",
                    "median_seconds",
                    "heldout_reward_start",
                    "heldout_reward_end",
                    "heldout_minutes",
                    "exit_code",
                    "failure",
                )
            }
            for run in runs
        },
    }
    if sync and overlapped and sync.get("steps_per_minute") and overlapped.get("steps_per_minute"):
        parts = sync["median_seconds"]
        ideal_step = max(parts["rollout_seconds"], parts["train_seconds"]) + parts["sync_seconds"]
        async_step = 60 / overlapped["steps_per_minute"]
        common = min(sync["heldout_minutes"][-1][0], overlapped["heldout_minutes"][-1][0])
        report.update(
            {
                "ideal_step_seconds": round(ideal_step, 3),
                "sync_step_seconds": round(60 / sync["steps_per_minute"], 3),
                "async_step_seconds": round(async_step, 3),
                "ideal_fraction": round(ideal_step / async_step, 3),
                "speedup": round(overlapped["steps_per_minute"] / sync["steps_per_minute"], 3),
                "common_minutes": common,
                "heldout_at_common_minutes": {
                    "sync": reward_at(sync["heldout_minutes"], common),
                    "async": reward_at(overlapped["heldout_minutes"], common),
                },
            }
        )
        at = report["heldout_at_common_minutes"]
        report["targets"] = TARGETS
        report["meets_target"] = (
            report["ideal_fraction"] >= TARGETS["ideal_fraction"]
            and report["speedup"] >= TARGETS["speedup"]
            and at["async"] is not None
            and at["sync"] is not None
            and at["async"] >= at["sync"]
        )
    return report


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curves, rates) = plt.subplots(1, 2, figsize=(11, 4))
    for run in runs:
        points = run.get("heldout_minutes") or []
        curves.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=run["mode"])
    curves.set_xlabel("minutes since the first step began")
    curves.set_ylabel("held-out mean reward")
    curves.legend()
    names = [run["mode"] for run in runs]
    rates.bar(names, [run.get("samples_per_minute") or 0 for run in runs])
    rates.set_ylabel("samples per minute")
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="learning_gpu.py JSON (or logs ending in one)")
    parser.add_argument(
        "--output", type=Path, required=True, help="PREFIX: writes PREFIX.json and PREFIX.png"
    )
    opts = parser.parse_args()
    runs = [last_json(path) for path in opts.results]
    report = compare(runs)
    plot(runs, opts.output.with_suffix(".png"))
    report["plot"] = str(opts.output.with_suffix(".png"))
    opts.output.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
