"""Blocking plugin calls (sync rewards and tools) in threads that a stuck call cannot take down.

asyncio's default executor is a ``ThreadPoolExecutor``: a call that never returns holds one of its threads
for good, later calls queue behind the stuck ones until they all time out, and shutdown (``asyncio.run``
and the interpreter's exit) waits for every thread, forever. :class:`BlockingPool` runs calls in daemon
threads instead. A caller that stops waiting (its timeout, or its task cancelled) abandons the call: the
thread is no longer counted and another one takes the next calls; the stuck thread finishes on its own
time, or never, and nothing waits for it at shutdown. At most ``max_abandoned`` threads may be stuck at
once: past that, calls fail at once with :class:`PoolExhausted`, which says so, instead of piling up
threads.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

DEFAULT_WORKERS = min(32, (os.cpu_count() or 1) + 4)
"""Threads running calls at once (``ThreadPoolExecutor``'s default)."""
DEFAULT_MAX_ABANDONED = 256
"""Threads the process's pool may leave stuck in calls that timed out before it refuses more calls."""


class PoolExhausted(RuntimeError):
    """Every thread the pool may abandon is stuck in a call that timed out."""


class _Call:
    __slots__ = ("run", "loop", "future", "state")

    def __init__(
        self, run: Callable[[], Any], loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]
    ) -> None:
        self.run, self.loop, self.future = run, loop, future
        self.state = "queued"  # then "running", and "done" or "abandoned"


class BlockingPool:
    """Up to ``workers`` threads running blocking calls; see the module docstring."""

    def __init__(
        self, workers: int = DEFAULT_WORKERS, max_abandoned: int | None = None, name: str = "rlsdk-blocking"
    ) -> None:
        if workers < 1:
            raise ValueError(f"a blocking pool needs at least 1 worker, got {workers}")
        self.workers = workers
        self.max_abandoned = workers if max_abandoned is None else max_abandoned
        self.name = name
        self.abandoned = 0  # threads stuck in calls whose callers stopped waiting
        self._threads = 0  # threads taking calls (not abandoned)
        self._idle = 0  # of those, waiting for a call
        self._queued = 0  # calls not yet taken by a thread
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._lock = threading.Lock()

    async def run(self, func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``func(*args, **kwargs)`` in a pool thread (with the caller's context variables), awaited."""
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        call = _Call(lambda: context.run(func, *args, **kwargs), loop, loop.create_future())
        with self._lock:
            if self.abandoned >= self.max_abandoned:
                raise PoolExhausted(
                    f"all {self.abandoned} threads of {self.name} that may be abandoned are stuck in calls "
                    f"that timed out; no more blocking calls can run in this process (make the callable "
                    f"return, or make it async)"
                )
            self._queued += 1
            if self._queued > self._idle and self._threads < self.workers:
                self._threads += 1
                threading.Thread(target=self._work, name=f"{self.name}-{self._threads}", daemon=True).start()
            self._calls.put(call)
        try:
            return await call.future
        except asyncio.CancelledError:
            self._abandon(call)
            raise

    def _abandon(self, call: _Call) -> None:
        with self._lock:
            if call.state == "queued":
                call.state = "abandoned"  # never runs; the thread that takes it skips it
            elif call.state == "running":
                call.state = "abandoned"
                self.abandoned += 1
                self._threads -= 1  # its thread no longer counts: the next call may start another

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            call = self._calls.get()
            with self._lock:
                self._idle -= 1
                self._queued -= 1
                if call.state == "abandoned":
                    continue
                call.state = "running"
            try:
                result, error = call.run(), None
            except BaseException as exc:  # handed to the caller
                result, error = None, exc
            with self._lock:
                if call.state == "abandoned":  # the caller gave up on it: this thread is spare now
                    self.abandoned -= 1
                    if self._threads >= self.workers:
                        return
                    self._threads += 1
                    continue
                call.state = "done"
            try:
                call.loop.call_soon_threadsafe(_deliver, call.future, result, error)
            except RuntimeError:  # the loop is closed: nobody is waiting
                pass


def _deliver(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


_default: BlockingPool | None = None


def blocking_pool() -> BlockingPool:
    """The process's pool for blocking plugin calls, created on first use."""
    global _default
    if _default is None:
        _default = BlockingPool(max_abandoned=DEFAULT_MAX_ABANDONED, name="the blocking-call pool")
    return _default
