"""What a training run shows besides the terminal: ``curves.png`` redrawn each step, and TensorBoard."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class RunReport:
    """Draws ``curves.png`` (train and eval reward, loss per step) from ``metrics.jsonl`` and ``eval.jsonl``
    after each step, so a resumed run's curve covers the whole run; with ``report_to="tensorboard"`` it
    also writes each step's metrics as TensorBoard scalars under ``tensorboard/``."""

    def __init__(self, folder: Path, report_to: str | None = None) -> None:
        if report_to not in (None, "tensorboard"):
            raise ValueError(f"report_to must be tensorboard (or unset), got {report_to!r}")
        self.folder = folder
        self.writer: Any = None
        if report_to == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(folder / "tensorboard"))

    def add(self, rollout_id: int, metrics: dict[str, Any]) -> None:
        if self.writer is not None:
            for key, value in numbers(metrics).items():
                self.writer.add_scalar(key, value, rollout_id)
            self.writer.flush()
        self.draw()

    def history(self, name: str) -> list[dict[str, Any]]:
        path = self.folder / name
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def draw(self) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        steps, evals = self.history("metrics.jsonl"), self.history("eval.jsonl")
        eval_keys = sorted(
            {k for row in evals for k in row if k.startswith("eval/") and k.endswith("/reward_mean")}
        )
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
        plot(top, steps, "rollout/reward_mean", "train reward (sampled)")
        for key in eval_keys:
            plot(top, evals, key, f"{key.removeprefix('eval/').removesuffix('/reward_mean')} (eval)")
        top.set_ylabel("mean reward")
        top.grid(alpha=0.3)
        if top.get_legend_handles_labels()[0]:
            top.legend(loc="lower right")
        plot(bottom, steps, "train/loss", "loss")
        bottom.set_ylabel("loss")
        bottom.set_xlabel("step")
        bottom.grid(alpha=0.3)
        fig.tight_layout()
        tmp = self.folder / ".curves.png"
        fig.savefig(tmp, dpi=90, format="png")
        plt.close(fig)
        tmp.replace(self.folder / "curves.png")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def plot(axis: Any, rows: list[dict[str, Any]], key: str, label: str) -> None:
    points = [(row["rollout_id"], row[key]) for row in rows if isinstance(row.get(key), int | float)]
    if points:
        axis.plot(*zip(*points, strict=True), marker="o", label=label)
