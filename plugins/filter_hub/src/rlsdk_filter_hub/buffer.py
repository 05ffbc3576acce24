"""Buffer filters: which buffered groups are served before fresh data. Each removes what it returns.
(``pop_first``, the default, is core's own: :func:`rlsdk.rollout.plugin.pop_first`.)"""

from __future__ import annotations

import logging
from typing import Any

from rlsdk import START_ROLLOUT_ID

log = logging.getLogger("rlsdk_filter_hub")


def pop_last(args: Any, rollout_id: int, buffer: list[list[Any]], num_samples: int) -> list[list[Any]]:
    """Serve the newest groups first (LIFO), removing them from the buffer.

    Example: a buffer ``[g0, g1, g2]`` asked for 2 serves ``[g2, g1]`` and keeps ``[g0]``.
    """
    count = min(max(num_samples, 0), len(buffer))
    taken = buffer[len(buffer) - count :][::-1]
    del buffer[len(buffer) - count :]
    return taken


def drop_stale(
    args: Any, rollout_id: int | None, buffer: list[list[Any]], num_samples: int
) -> list[list[Any]]:
    """Drop groups whose generation started more than ``args.buffer_max_staleness`` steps before
    ``rollout_id``, then serve the rest oldest first (ties in buffer order).

    A group's start is the smallest ``metadata["start_rollout_id"]`` of its samples (``add_samples``
    records it); a group without one counts as current. The data source counts the dropped groups in
    its ``buffer_groups_dropped`` metric. With no limit set nothing is dropped.

    Example: with ``buffer_max_staleness: 2`` at rollout 5, groups started at steps ``[2, 4, 3]`` lose
    the first (5 - 2 > 2); asked for 1, the filter serves the group from step 3 and keeps the one from 4.
    """
    # slime calls buffer filters with rollout_id=None: then no group can be judged stale
    limit = getattr(args, "buffer_max_staleness", None) if rollout_id is not None else None
    starts = {id(g): _start(g, rollout_id) for g in buffer}

    def stale(group: list[Any]) -> bool:
        start = starts[id(group)]
        return (
            limit is not None and rollout_id is not None and start is not None and rollout_id - start > limit
        )

    fresh = [g for g in buffer if not stale(g)]
    if len(fresh) < len(buffer):
        log.info(
            "drop_stale: dropped %d buffered groups older than %s steps at rollout %d",
            len(buffer) - len(fresh),
            limit,
            rollout_id,
        )
    taken = sorted(fresh, key=lambda g: (starts[id(g)] is None, starts[id(g)] or 0))[: max(num_samples, 0)]
    served = {id(g) for g in taken}
    buffer[:] = [g for g in fresh if id(g) not in served]
    return taken


def _start(group: list[Any], default: int | None) -> int | None:
    starts = [s.metadata.get(START_ROLLOUT_ID) for s in group if s.metadata]
    starts = [s for s in starts if isinstance(s, int)]
    return min(starts) if starts else default
