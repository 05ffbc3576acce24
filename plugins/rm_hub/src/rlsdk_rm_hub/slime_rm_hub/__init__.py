"""slime's ``slime.rollout.rm_hub`` modules under their own names, backed by rm_hub's functions, so a
slime reward function that imports them runs without slime (rlsdk's compatibility layer maps the names
here) and slime's own reward tests can judge rm_hub's verdicts.

``async_rm`` and ``batched_async_rm`` score through rlsdk's reward call point: ``--custom-rm-path`` and
``--rm-type`` resolve rlsdk reward names (every slime name among them).
"""

from __future__ import annotations

from typing import Any

from rlsdk import REWARD_ERROR, score_samples

from .deepscaler import get_deepscaler_rule_based_reward
from .f1 import f1_score
from .gpqa import compute_gpqa_reward
from .math_dapo_utils import compute_score as compute_score_dapo
from .math_utils import extract_answer as extract_boxed_answer
from .math_utils import grade_answer_verl

__all__ = [
    "async_rm",
    "batched_async_rm",
    "compute_gpqa_reward",
    "compute_score_dapo",
    "extract_boxed_answer",
    "f1_score",
    "get_deepscaler_rule_based_reward",
    "grade_answer_verl",
]


async def async_rm(args: Any, sample: Any, **kwargs: Any) -> Any:
    """One sample's reward, chosen as slime's ``async_rm`` chooses it, through rlsdk's reward call point
    with the plugins of the run in progress; a reward that fails raises, naming the plugin."""
    return (await batched_async_rm(args, [sample], **kwargs))[0]


async def batched_async_rm(args: Any, samples: list, **kwargs: Any) -> list:
    """The rewards of several samples, as slime's ``batched_async_rm`` (each sample's ``reward`` is set)."""
    await score_samples(args, samples)
    failed = [s for s in samples if s.reward is None and REWARD_ERROR in (s.metadata or {})]
    if failed:
        raise RuntimeError(failed[0].metadata[REWARD_ERROR])
    return [s.reward for s in samples]
