"""Where plugins send CPU-heavy work: ``"module:function"`` tasks with arguments and a timeout each.

A plugin keeps a pool of its own for a run on one machine (rm_hub's grader processes). When the run is on
a Ray cluster, :mod:`rlsdk.ray` installs a pool of Ray tasks here, and a plugin that asks
:func:`cluster_task_pool` first sends its tasks across the cluster's nodes instead; each node imports the
task's function from its own environment.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Protocol


class TaskPool(Protocol):
    """Runs ``spec(*args)`` (``spec`` is ``"module:function"``) somewhere, within ``timeout`` seconds."""

    def submit(self, spec: str, args: tuple[Any, ...], timeout: float) -> concurrent.futures.Future[Any]:
        """Start the task; the future holds its result, or the error of a task that failed or timed out."""
        ...

    async def arun(self, spec: str, args: tuple[Any, ...], timeout: float) -> Any:
        """Run the task and return its result."""
        ...

    def warm(self) -> None:
        """Get ready for the first task (start a worker) without waiting for it."""
        ...


_cluster_pool: TaskPool | None = None


def cluster_task_pool() -> TaskPool | None:
    """The cluster's pool while a run is on Ray, else None (use your own)."""
    return _cluster_pool


def set_cluster_task_pool(pool: TaskPool | None) -> None:
    """Install (or with None remove) the cluster's pool; :mod:`rlsdk.ray` does this for a run."""
    global _cluster_pool
    _cluster_pool = pool
