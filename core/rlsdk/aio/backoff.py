"""Waiting between retries: exponential backoff with full jitter, so clients that failed together do not
come back together."""

from __future__ import annotations

import random


def backoff_delay(attempt: int, base: float, cap: float = 30.0) -> float:
    """Seconds before retry ``attempt`` (0 for the first): uniform in [0, min(cap, base * 2**attempt)]."""
    return random.uniform(0, min(cap, base * 2**attempt))
