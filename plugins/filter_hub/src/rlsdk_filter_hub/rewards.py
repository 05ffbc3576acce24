"""Reading rewards the way every filter does: float or dict rewards, with invalid ones as None."""

from __future__ import annotations

import math
import statistics
from typing import Any

from rlsdk import Sample, reward_value

FAILED_STATUSES = (Sample.Status.FAILED, Sample.Status.ABORTED)


def value(sample: Sample, key: str | None) -> float | None:
    """``sample.reward`` as a float (``reward[key]`` for a dict reward); None, NaN and a None entry are
    invalid and give None. A dict reward without ``key`` is an error naming its keys."""
    result = (
        reward_value(sample.reward, key)
        if isinstance(sample.reward, dict)
        else reward_value(sample.reward, None)
    )
    return None if result is None or math.isnan(result) else result


def valid_values(samples: list[Sample], key: str | None) -> list[float]:
    """The valid rewards of a group."""
    return [v for v in (value(s, key) for s in samples) if v is not None]


def lacks_valid_reward(sample: Sample, key: str | None) -> bool:
    """A sample that failed, was aborted, was marked for removal or has no valid reward (a dict reward
    without ``key`` counts as valid: there is no entry to check)."""
    if sample.status in FAILED_STATUSES or sample.remove_sample or sample.reward is None:
        return True
    if isinstance(sample.reward, dict) and key is None:
        return False
    return value(sample, key) is None


def spread(values: list[float]) -> float:
    """Population standard deviation; 0.0 for fewer than two values."""
    return statistics.pstdev(values) if len(values) > 1 else 0.0


def reward_key(args: Any) -> str | None:
    return getattr(args, "reward_key", None)
