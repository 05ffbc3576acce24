"""CPU-heavy tasks (the math grader's, and plain sync rewards with ``ray_sync_rewards``) as Ray tasks
across the cluster's nodes.

Each task imports its ``"module:function"`` from the worker's own environment and runs it on the worker's
main thread under a ``SIGALRM`` timer (math-verify's timeouts need the main thread). A worker that dies
with a task (killed, out of memory, its node gone) costs nothing but time: Ray runs the task again on
another worker, so the sample is scored elsewhere. A task still running past its timeout plus a grace is
cancelled and its worker killed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import importlib
import signal
import threading
from typing import Any

from ..aio.task_pools import cluster_task_pool
from ..errors import RlsdkError
from ..plugins.loading import is_path
from ..plugins.manager import get_plugin_manager
from ..plugins.run_plugins import RunPlugins
from .cluster import first_line, import_ray
from ..config import RolloutConfig

RETRIES = 3
"""Times a task is run again after its worker died."""
KILL_GRACE_S = 2.0
"""Seconds past its timeout after which a task's worker is killed."""
REWARD_TASK_TIMEOUT_S = 3600.0
"""A reward task's timeout when the run gives it none."""


class TaskError(RlsdkError):
    """A task raised, timed out, or lost its worker more than :data:`RETRIES` times."""


class _Timeout(BaseException):
    """Raised in a task by its timer; a BaseException so a grader's ``except Exception`` cannot hide it."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Timeout


def run_task(spec: str, args: tuple[Any, ...], timeout: float) -> tuple[bool, Any]:
    """``spec(*args)`` in this worker: (True, result), or (False, why) when it raised or timed out."""
    module, _, name = spec.partition(":")
    func = getattr(importlib.import_module(module), name)
    timed = threading.current_thread() is threading.main_thread()
    if timed:
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return True, func(*args)
    except _Timeout:
        return False, f"timed out after {timeout:g}s"
    except Exception as exc:  # noqa: BLE001 - reported to the caller, which marks the sample invalid
        return False, f"{type(exc).__name__}: {exc}"
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)


@functools.cache
def worker_plugins() -> RunPlugins:
    """This worker process's plugins, discovered once: a task resolves its reward from the worker's own
    environment (the driver's resolved plugin does not travel)."""
    return RunPlugins(RolloutConfig(), get_plugin_manager())


def score_reward(
    spec: str, group: bool, args: RolloutConfig, target: Any, kwargs: dict[str, Any]
) -> tuple[Any, Any]:
    """A Ray task: the reward ``spec`` (a registered name or a path) resolved from this worker's own
    environment, called on ``target``; its result and ``target`` (which a reward may have changed). The
    driver's :func:`rlsdk.plugins.calls.call_reward` checks the result, as for a reward run in a thread."""
    resolved = worker_plugins().resolve("reward", spec, group=group)
    return resolved.func(args, target, **kwargs), target


async def score_on_cluster(
    args: RolloutConfig, resolved: Any, target: Any, kwargs: dict[str, Any], timeout: float | None
) -> Any:
    """Score ``target`` (a sample, or a group's list) with the sync reward ``resolved`` as a task of the
    cluster's pool (:func:`score_reward`); what the reward changed on the samples is copied back."""
    info = resolved.info
    spec = info.plugin if info.distribution is None and is_path(info.plugin) else resolved.name
    pool = cluster_task_pool()
    assert pool is not None
    result, scored = await pool.arun(
        f"{__name__}:score_reward",
        (spec, bool(resolved.record.group), args, target, kwargs),
        timeout or REWARD_TASK_TIMEOUT_S,
    )
    if not isinstance(target, list):
        target, scored = [target], [scored]
    for sample, remote in zip(target, scored, strict=True):
        vars(sample).update(vars(remote))
    return result


class RayTaskPool:
    """A :class:`rlsdk.aio.task_pools.TaskPool` of Ray tasks (one logical CPU each)."""

    def __init__(self, cpus_per_task: float = 1.0) -> None:
        ray = import_ray()
        self._remote = ray.remote(run_task).options(
            num_cpus=cpus_per_task, max_retries=RETRIES, retry_exceptions=False
        )

    def submit(self, spec: str, args: tuple[Any, ...], timeout: float) -> concurrent.futures.Future[Any]:
        ray = import_ray()
        ref = self._remote.remote(spec, args, timeout)
        result: concurrent.futures.Future[Any] = concurrent.futures.Future()
        watchdog = threading.Timer(timeout + KILL_GRACE_S, ray.cancel, (ref,), {"force": True})
        watchdog.daemon = True

        def settle(done: concurrent.futures.Future[Any]) -> None:
            watchdog.cancel()
            try:
                ok, value = done.result()
            except ray.exceptions.TaskCancelledError:
                result.set_exception(
                    TaskError(f"{spec} timed out after {timeout:g}s (its Ray worker killed)")
                )
            except ray.exceptions.RayError as exc:
                result.set_exception(TaskError(f"{spec} failed on Ray: {first_line(exc)}"))
            else:
                if ok:
                    result.set_result(value)
                else:
                    result.set_exception(TaskError(f"{spec}: {value}"))

        ref.future().add_done_callback(settle)
        watchdog.start()
        return result

    async def arun(self, spec: str, args: tuple[Any, ...], timeout: float) -> Any:
        return await asyncio.wrap_future(self.submit(spec, args, timeout))

    def run(self, spec: str, args: tuple[Any, ...], timeout: float) -> Any:
        return self.submit(spec, args, timeout).result()

    def warm(self) -> None:
        """Ray keeps its workers started; nothing to do."""
