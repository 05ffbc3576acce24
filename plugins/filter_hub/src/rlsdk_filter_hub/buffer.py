"""Buffer filters: which buffered groups are served before fresh data."""

from __future__ import annotations

from typing import Any


def pop_first(args: Any, rollout_id: int, buffer: list[list[Any]], num_samples: int) -> list[list[Any]]:
    """Serve the oldest groups first (FIFO), removing them from the buffer.

    Example: a buffer ``[g0, g1, g2]`` asked for 2 serves ``[g0, g1]`` and keeps ``[g2]``.
    """
    taken = buffer[: max(num_samples, 0)]
    del buffer[: len(taken)]
    return taken
