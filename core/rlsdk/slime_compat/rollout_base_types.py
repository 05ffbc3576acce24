"""Stands in for ``slime.rollout.base_types``."""

from __future__ import annotations

from typing import Any

from ..types import RolloutFnEvalOutput, RolloutFnTrainOutput

__all__ = ["RolloutFnEvalOutput", "RolloutFnTrainOutput", "call_rollout_fn"]


def call_rollout_fn(fn: Any, *args: Any, evaluation: bool, **kwargs: Any) -> Any:
    """Call a rollout function; a bare list of groups or eval dict (slime's legacy form) is wrapped."""
    output = fn(*args, **kwargs, evaluation=evaluation)
    if isinstance(output, (RolloutFnTrainOutput, RolloutFnEvalOutput)):
        return output
    return RolloutFnEvalOutput(data=output) if evaluation else RolloutFnTrainOutput(samples=output)
