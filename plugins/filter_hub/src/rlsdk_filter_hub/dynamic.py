"""Dynamic filters: keep or drop each finished group. Invalid rewards (None, NaN) are ignored."""

from __future__ import annotations

import math
from typing import Any

from rlsdk import DynamicFilterOutput, Sample

from .rewards import reward_key, valid_values


def check_reward_nonzero_std(args: Any, samples: list[Sample], **kwargs: Any) -> DynamicFilterOutput:
    """Keep groups whose rewards differ (DAPO dynamic sampling, slime's filter).

    Reads the reward selected by ``args.reward_key`` for dict rewards. Fewer than two valid rewards
    drop as ``too_few_valid_rewards``.

    Example: rewards ``[1, 0, 1, 1]`` are kept; ``[1, 1, 1, 1]`` drop as ``zero_std_1.0``;
    ``[1, None]`` drops as ``too_few_valid_rewards``.
    """
    return _nonzero_std(valid_values(samples, reward_key(args)), "zero_std_")


def check_reward_nonzero_std_with_fallback(
    args: Any, samples: list[Sample], **kwargs: Any
) -> DynamicFilterOutput:
    """Like ``check_reward_nonzero_std``, but a dropped group may still be used when too few groups pass
    (``keep_when_insufficient=True``), so a step never starves on an easy or hard batch.

    Example: ``[1, 1, 1, 1]`` gives ``DynamicFilterOutput(keep=False, reason="zero_std_1.0",
    keep_when_insufficient=True)``.
    """
    verdict = check_reward_nonzero_std(args, samples)
    verdict.keep_when_insufficient = not verdict.keep
    return verdict


def check_metric_nonzero_std(args: Any, samples: list[Sample], **kwargs: Any) -> DynamicFilterOutput:
    """Keep groups whose raw metric ``reward[args.dynamic_filter_metric_key]`` differs, not the shaped
    reward: DAPO filters on accuracy (``acc``) while training on ``score``. Float rewards are their
    own metric; booleans count as 0/1.

    Example: with ``dynamic_filter_metric_key: acc``, rewards ``[{"score": 1.0, "acc": True},
    {"score": -1.0, "acc": False}]`` are kept; all ``acc: True`` drop as ``zero_std_acc_1.0``.
    """
    key = getattr(args, "dynamic_filter_metric_key", "acc")  # slime's args lack rlsdk's options
    return _nonzero_std(valid_values(samples, key), f"zero_std_{key}_")


def reward_range(args: Any, samples: list[Sample], **kwargs: Any) -> DynamicFilterOutput:
    """Keep groups whose mean valid reward lies strictly between ``args.reward_range_min`` and
    ``args.reward_range_max`` (default 0 and 1: drop groups all solved or all failed).

    Example: with the defaults, ``[1, 0, 0]`` (mean 0.33) is kept, ``[0, 0]`` drops as
    ``mean_le_min`` and ``[1, 1]`` as ``mean_ge_max``; ``[None]`` drops as ``no_valid_rewards``.
    """
    values = valid_values(samples, reward_key(args))
    if not values:
        return DynamicFilterOutput(keep=False, reason="no_valid_rewards")
    mean = math.fsum(values) / len(values)
    low, high = getattr(args, "reward_range_min", 0.0), getattr(args, "reward_range_max", 1.0)  # both read
    if mean <= low:
        return DynamicFilterOutput(keep=False, reason="mean_le_min")
    if mean >= high:
        return DynamicFilterOutput(keep=False, reason="mean_ge_max")
    return DynamicFilterOutput(keep=True)


def _nonzero_std(values: list[float], reason_prefix: str) -> DynamicFilterOutput:
    if len(values) < 2:
        return DynamicFilterOutput(keep=False, reason="too_few_valid_rewards")
    if max(values) > min(values):  # the standard deviation is above zero
        return DynamicFilterOutput(keep=True)
    return DynamicFilterOutput(keep=False, reason=f"{reason_prefix}{round(values[0], 1)}")
