"""Core's own run-level plugins, registered through core's ``run`` entry point like any other: the logging
backends (``jsonl``, ``tensorboard``, ``wandb``) and the ``arithmetic`` environment (the default demo)."""

from __future__ import annotations

from typing import Any

from ..plugins.hookspecs import hookimpl
from ..plugins.kinds import Environment, EvalRolloutLog, RolloutLog
from . import arithmetic, loggers


@hookimpl
def rlsdk_rollout_logs() -> Any:
    yield RolloutLog(name="jsonl", func=loggers.jsonl_rollout_log)
    yield RolloutLog(name="tensorboard", func=loggers.tensorboard_rollout_log)
    yield RolloutLog(name="wandb", func=loggers.wandb_rollout_log)


@hookimpl
def rlsdk_eval_rollout_logs() -> Any:
    yield EvalRolloutLog(name="jsonl", func=loggers.jsonl_eval_rollout_log)
    yield EvalRolloutLog(name="tensorboard", func=loggers.tensorboard_eval_rollout_log)
    yield EvalRolloutLog(name="wandb", func=loggers.wandb_eval_rollout_log)


@hookimpl
def rlsdk_environments() -> Any:
    yield Environment(
        name="arithmetic",
        func=arithmetic.settings,
        description="Single-digit arithmetic (the default demo), graded by math",
        train_settings=arithmetic.DEMO_TRAINING,
    )
