"""The summary a run ends with: each eval set's reward before and after training, the training reward of
the first and last step, the eval samples that were not scored, and the steps that had no learning signal.
Read from the run folder's files, so a resumed run's summary covers the whole run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..config import RolloutConfig
from ..outputs import EVAL_FILE, METRICS_FILE
from .learning_signal import no_signal


def run_summary(args: RolloutConfig, folder: Path) -> list[str]:
    """The summary's lines for the run in ``folder`` (its settings ``args``)."""
    steps, evals = rows_of(folder / METRICS_FILE), rows_of(folder / EVAL_FILE)
    lines = [f"summary of {folder} ({len(steps)} steps):"]
    lines += eval_lines(evals)
    rewards = [(row["rollout_id"], row.get("rollout/reward_mean_before_filter")) for row in steps]
    rewards = [(step, reward) for step, reward in rewards if reward is not None]
    if rewards:
        (first, before), (last, after) = rewards[0], rewards[-1]
        change = f" -> {after:.3f} at step {last}" if last != first else ""
        lines.append(f"  train reward (sampled): {before:.3f} at step {first}{change}")
    found = [(row["rollout_id"], no_signal(args, row)) for row in steps]
    flat = [(step, problem) for step, problem in found if problem is not None]
    if flat:
        ids = ", ".join(str(step) for step, _ in flat[:10]) + (", ..." if len(flat) > 10 else "")
        last = flat[-1][1].removeprefix("no learning signal: ")
        lines.append(f"  {len(flat)} of {len(steps)} steps had no learning signal ({ids}): {last}")
    return lines


def eval_lines(evals: list[dict[str, Any]]) -> list[str]:
    """Each eval set's reward at the first eval and the last (``before training`` for the eval before the
    first step), and the samples of all evals that failed or got no valid reward."""
    if not evals:
        return ["  no eval ran (--eval-interval N and --eval-data set one)"]
    first, last = evals[0], evals[-1]
    lines = []
    names = [key.split("/")[1] for key in last if key.startswith("eval/") and key.endswith("/reward_mean")]
    for name in names:
        key = f"eval/{name}/reward_mean"
        after = reward_text(last.get(key))
        if first is last or key not in first:
            lines.append(f"  eval {name}: reward {after} {when(last)}")
        else:
            before = first[key]
            change = f" ({last[key] - before:+.3f})" if None not in (before, last[key]) else ""
            lines.append(
                f"  eval {name}: reward {reward_text(before)} {when(first)} -> {after} {when(last)}{change}"
            )
        failed = sum(row.get(f"eval/{name}/failed", 0) for row in evals)
        unscored = sum(row.get(f"eval/{name}/invalid", 0) for row in evals)
        if unscored:
            lines.append(
                f"    {unscored} of its samples were not scored ({failed} failed); see eval_samples.jsonl"
            )
    return lines


def when(row: dict[str, Any]) -> str:
    return "before training" if row["rollout_id"] < 0 else f"after step {row['rollout_id']}"


def reward_text(value: float | None) -> str:
    return "none scored" if value is None else f"{value:.3f}"


def rows_of(path: Path) -> list[dict[str, Any]]:
    """A JSONL file's rows; none where it does not exist, and a line a crash cut is skipped."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
