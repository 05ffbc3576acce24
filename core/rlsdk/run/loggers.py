"""Logging backends as plugins (``--rollout-log jsonl,tensorboard,wandb``, ``--eval-rollout-log ...``), with
slime's logging signatures: ``log(rollout_id, args, samples, rollout_extra_metrics, rollout_time)`` and
``log(rollout_id, args, data, extra_metrics)``. Each writes under the run's folder (``args.output_dir``);
``metrics.jsonl`` and ``eval.jsonl`` are written whatever backends run."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from ..report import numbers
from ..types import reward_value
from ..config import RolloutConfig

LOG_FOLDER = "logs"
ROLLOUT_LOG = f"{LOG_FOLDER}/rollout_log.jsonl"
EVAL_ROLLOUT_LOG = f"{LOG_FOLDER}/eval_rollout_log.jsonl"
LOG_FILES = (ROLLOUT_LOG, EVAL_ROLLOUT_LOG)
"""The JSON-lines loggers' files, relative to the run's folder: cut back on ``--resume`` as its own files are
(TensorBoard's and wandb's event files are not: a step run again after a crash appears there twice)."""


def _folder(args: RolloutConfig) -> Path:
    folder = Path(args.output_dir) / LOG_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _append(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as out:
        out.write(json.dumps(row, default=str) + "\n")


def _sample_rows(args: RolloutConfig, samples: list[Any]) -> list[dict[str, Any]]:
    key = getattr(args, "reward_key", None)
    return [
        {
            "group_index": s.group_index,
            "index": s.index,
            "reward": reward_value(s.reward, key) if not isinstance(s.reward, dict) or key else None,
            "response_length": s.response_length,
            "status": getattr(s.status, "value", s.status),
        }
        for s in samples
    ]


def jsonl_rollout_log(
    rollout_id: int,
    args: RolloutConfig,
    samples: list[Any],
    rollout_extra_metrics: dict[str, Any],
    rollout_time: float,
) -> bool:
    """One JSON line per step in ``logs/rollout_log.jsonl``: its numeric metrics and each sample's reward."""
    row = {
        "rollout_id": rollout_id,
        "rollout_time": rollout_time,
        "metrics": numbers(rollout_extra_metrics),
        "samples": _sample_rows(args, samples),
    }
    _append(_folder(args).parent / ROLLOUT_LOG, row)
    return False


def jsonl_eval_rollout_log(
    rollout_id: int, args: RolloutConfig, data: dict[str, Any], extra_metrics: dict[str, Any]
) -> bool:
    """One JSON line per eval in ``logs/eval_rollout_log.jsonl``: its numeric metrics and each dataset's rewards."""
    row = {
        "rollout_id": rollout_id,
        "metrics": numbers(extra_metrics),
        "rewards": {name: part.get("rewards", []) for name, part in data.items()},
    }
    _append(_folder(args).parent / EVAL_ROLLOUT_LOG, row)
    return False


@functools.cache
def _tensorboard(folder: str) -> Any:
    from torch.utils.tensorboard import SummaryWriter  # heavy and optional: only when this backend is named

    return SummaryWriter(log_dir=folder)


def _scalars(writer: Any, step: int, metrics: dict[str, Any]) -> None:
    for key, value in numbers(metrics).items():
        writer.add_scalar(key, value, step)
    writer.flush()


def tensorboard_rollout_log(
    rollout_id: int,
    args: RolloutConfig,
    samples: list[Any],
    rollout_extra_metrics: dict[str, Any],
    rollout_time: float,
) -> bool:
    """Each step's numeric metrics as TensorBoard scalars under ``logs/tensorboard``."""
    metrics = {**rollout_extra_metrics, "rollout/rollout_time": rollout_time}
    _scalars(_tensorboard(str(_folder(args) / "tensorboard")), rollout_id, metrics)
    return False


def tensorboard_eval_rollout_log(
    rollout_id: int, args: RolloutConfig, data: dict[str, Any], extra_metrics: dict[str, Any]
) -> bool:
    """Each eval's numeric metrics as TensorBoard scalars under ``logs/tensorboard``."""
    _scalars(_tensorboard(str(_folder(args) / "tensorboard")), rollout_id, extra_metrics)
    return False


@functools.cache
def _wandb_run(folder: str, project: str) -> Any:
    try:
        import wandb  # optional: pip install wandb
    except ImportError as exc:
        raise RuntimeError("the wandb logger needs the wandb package: pip install wandb") from exc
    return wandb.init(project=project, dir=folder, mode="offline", reinit=True)


def _wandb(args: RolloutConfig) -> Any:
    return _wandb_run(str(_folder(args)), getattr(args, "wandb_project", None) or "rlsdk")


def wandb_rollout_log(
    rollout_id: int,
    args: RolloutConfig,
    samples: list[Any],
    rollout_extra_metrics: dict[str, Any],
    rollout_time: float,
) -> bool:
    """Each step's numeric metrics to Weights & Biases in offline mode (``logs/wandb``; ``wandb sync`` uploads)."""
    _wandb(args).log(
        {**numbers(rollout_extra_metrics), "rollout/rollout_time": rollout_time}, step=rollout_id
    )
    return False


def wandb_eval_rollout_log(
    rollout_id: int, args: RolloutConfig, data: dict[str, Any], extra_metrics: dict[str, Any]
) -> bool:
    """Each eval's numeric metrics to Weights & Biases in offline mode."""
    _wandb(args).log(numbers(extra_metrics), step=max(rollout_id, 0))
    return False
