"""Stands in for ``slime.rollout.fully_async_rollout``: ``generate_rollout_fully_async`` is rlsdk's rollout
step. slime's fully-async worker keeps generating across rollout boundaries while ``train_async.py`` trains;
rlsdk's ``--async`` loop does the same from one function (the next step generates while the trainer trains,
staleness bounded by ``--max-policy-version-lag``). Where slime's worker queues finished groups beyond the
batch for the next rollout, rlsdk's step returns them to the buffer (served first next step); groups still in
flight when a step has its batch are aborted and served again (resumed from their tokens with
``--partial-rollout``), and unlike slime's worker they are in the checkpoint, so a resumed run loses none.
As slime's, it has no evaluation mode."""

from __future__ import annotations

from typing import Any

from ..config import RolloutConfig
from ..rollout.step import generate_rollout

__all__ = ["generate_rollout_fully_async"]


def generate_rollout_fully_async(
    args: RolloutConfig, rollout_id: int, data_buffer: Any, evaluation: bool = False
) -> Any:
    """slime's ``--rollout-function-path`` entry point: one training step (see the module)."""
    if evaluation:
        raise ValueError(
            "fully-async rollout doesn't support evaluation mode (as in slime): give --eval-function-path sglang "
            "to evaluate"
        )
    return generate_rollout(args, rollout_id, data_buffer)
