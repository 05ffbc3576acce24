"""Over-sampling filters: order the kept groups before the loop keeps the first ``rollout_batch_size``."""

from __future__ import annotations

from typing import Any

from rlsdk import Sample

from .rewards import lacks_valid_reward, reward_key, spread, valid_values


def sort_by_reward_std(args: Any, groups: list[list[Sample]], **kwargs: Any) -> list[list[Sample]]:
    """Groups with the widest reward spread first (stable: ties keep their order); groups with no valid
    reward go last. Invalid rewards are ignored; dict rewards are read at ``args.reward_key``.

    Example: groups with rewards ``[1, 1]``, ``[0, 1]``, ``[None]`` come back as
    ``[0, 1]``, ``[1, 1]``, ``[None]``.
    """
    key = reward_key(args)

    def order(group: list[Sample]) -> float:
        values = valid_values(group, key)
        return -spread(values) if values else 1.0

    return sorted(groups, key=order)


def prefer_fewer_invalid(args: Any, groups: list[list[Sample]], **kwargs: Any) -> list[list[Sample]]:
    """Groups with fewer invalid samples first (stable). Invalid: failed or aborted, marked for removal,
    or without a valid reward.

    Example: groups with rewards ``[None, None]``, ``[1, None]``, ``[0, 1]`` come back as
    ``[0, 1]``, ``[1, None]``, ``[None, None]``.
    """
    key = reward_key(args)
    return sorted(groups, key=lambda group: sum(lacks_valid_reward(s, key) for s in group))
