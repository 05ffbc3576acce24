"""Dynamic filters: keep or drop each finished group."""

from __future__ import annotations

import statistics
from typing import Any

from rlsdk import DynamicFilterOutput


def check_reward_nonzero_std(args: Any, samples: list[Any], **kwargs: Any) -> DynamicFilterOutput:
    """Keep groups whose rewards differ (DAPO dynamic sampling); invalid rewards are ignored.

    Example: rewards ``[1, 0, 1, 1]`` are kept; ``[1, 1, 1, 1]`` drop as ``zero_std_1.0``.
    """
    rewards = [r for r in (s.get_reward_value(args) for s in samples) if r is not None]
    if len(rewards) < 2:
        return DynamicFilterOutput(keep=False, reason="too_few_valid_rewards")
    if statistics.pstdev(rewards) > 0.0:
        return DynamicFilterOutput(keep=True)
    return DynamicFilterOutput(keep=False, reason=f"zero_std_{round(rewards[0], 1)}")
