"""What a training run shows besides the terminal: ``curves.png`` redrawn each step, and TensorBoard."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


PANELS = (
    ("KL", (("train/ppo_kl", "to the sampling policy"), ("train/kl_loss", "to the reference"))),
    ("entropy", (("train/entropy_loss", "entropy"),)),
    ("response length (tokens)", (("rollout/response_len_mean", "mean"),)),
    ("clip fraction", (("train/pg_clipfrac", "clipped"),)),
)
"""The panels under the rewards: what people read to see a run learn (the GRPO loss, near 0 by
construction, is in metrics.jsonl and TensorBoard)."""


class RunReport:
    """Draws ``curves.png`` (train and eval reward, KL, entropy, response length, clip fraction per step) from ``metrics.jsonl`` and ``eval.jsonl``
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
        """Write ``curves.png`` (atomically: a reader never sees half a file)."""
        import matplotlib.pyplot as plt

        fig = self.figure()
        tmp = self.folder / ".curves.png"
        fig.savefig(tmp, dpi=90, format="png")
        plt.close(fig)
        tmp.replace(self.folder / "curves.png")

    def figure(self) -> Any:
        """The run's name on top; the train and eval rewards across the top row (the legend above the axes,
        off the data); then :data:`PANELS`, each from the steps that report it."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        steps, evals = self.history("metrics.jsonl"), self.history("eval.jsonl")
        eval_keys = sorted(
            {k for row in evals for k in row if k.startswith("eval/") and k.endswith("/reward_mean")}
        )
        fig = plt.figure(figsize=(9, 9))
        grid = fig.add_gridspec(3, 2)
        reward = fig.add_subplot(grid[0, :])
        plot(reward, steps, "rollout/reward_mean", "train reward (sampled, kept groups)")
        for key in eval_keys:
            plot(reward, evals, key, f"{key.removeprefix('eval/').removesuffix('/reward_mean')} (eval)")
        reward.set_ylabel("mean reward")
        reward.grid(alpha=0.3)
        if reward.get_legend_handles_labels()[0]:
            reward.legend(loc="lower left", bbox_to_anchor=(0, 1.01), ncol=3, frameon=False, fontsize="small")
        for index, (title, keys) in enumerate(PANELS):
            axis = fig.add_subplot(grid[1 + index // 2, index % 2], sharex=reward)
            for key, label in keys:
                plot(axis, steps, key, label)
            axis.set_title(title, fontsize="medium")
            axis.grid(alpha=0.3)
            if len(axis.get_legend_handles_labels()[0]) > 1:
                axis.legend(fontsize="x-small", loc="best")
            if index >= 2:
                axis.set_xlabel("step")
        fig.suptitle(f"rlsdk run: {self.folder.resolve().name}")
        fig.tight_layout()
        return fig

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
