"""Timeouts for many concurrent calls on one timer per duration.

``asyncio.timeout`` puts one timer per call into the event loop's heap, whose entries compare in Python,
and its ``async with`` builds two coroutines per call; the rollout loop sets one timeout per sample and one
per reward call. :func:`deadline` behaves as ``asyncio.timeout`` does (at the deadline the task is
cancelled and ``TimeoutError`` raised in its place; a cancellation from elsewhere still propagates), but it
is a plain ``with`` block, and the calls of one duration on one loop wait in a queue: in start order, which
is also their order of expiry, watched by a single timer set for the oldest. When it goes off, the calls
whose deadlines have passed time out, and it is set again for the next deadline, but no sooner than
:data:`RESOLUTION` from then: calls that started close together time out together, at most that late.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any, Self

RESOLUTION = 0.01
"""Seconds: after the timer goes off it is set again no sooner than this, so a call may time out that late."""


class _Queue:
    """The running calls of one duration on one loop, oldest first, and the timer set for the oldest."""

    __slots__ = ("loop", "seconds", "calls", "timer", "idle_check")

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
        self.loop, self.seconds = loop, seconds
        self.calls: dict[_Deadline, float] = {}  # call -> when it expires; insertion order is expiry order
        self.timer: asyncio.TimerHandle | None = None
        self.idle_check = False

    def add(self, call: _Deadline) -> None:
        when = self.calls[call] = self.loop.time() + self.seconds
        if self.timer is None:
            self.timer = self.loop.call_at(when, self.expire)

    def remove(self, call: _Deadline) -> None:
        del self.calls[call]
        if not self.calls and not self.idle_check:
            # Empty now, but calls that run one at a time empty it at every call: look again once the
            # loop has run what it has ready, and only then drop the timer and the loop's table.
            self.idle_check = True
            self.loop.call_soon(self.close_if_idle)

    def close_if_idle(self) -> None:
        self.idle_check = False
        if not self.calls:
            if self.timer is not None:
                self.timer.cancel()
            self.close()

    def expire(self) -> None:
        """Cancel every call whose deadline has passed; set the timer for the oldest of the rest."""
        self.timer = None
        now = self.loop.time()
        late = []
        for call, when in self.calls.items():
            if when > now:  # not yet: set the timer again, for no sooner than RESOLUTION from now
                self.timer = self.loop.call_at(max(when, now + RESOLUTION), self.expire)
                break
            late.append(call)
        for call in late:
            del self.calls[call]
            call.expired = True
            call.task.cancel()
        if not self.calls:
            self.close()

    def close(self) -> None:
        self.timer = None
        queues = _queues.get(self.loop)
        if queues is not None and queues.get(self.seconds) is self:
            del queues[self.seconds]
            if not queues:
                del _queues[self.loop]


_queues: dict[asyncio.AbstractEventLoop, dict[float, _Queue]] = {}
"""Each loop's queues by duration; a loop is here only while it has calls running under a deadline."""


class _Deadline:
    """``with deadline(seconds)``: see the module docstring."""

    __slots__ = ("seconds", "task", "cancelling", "queue", "expired")

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.expired = False

    def __enter__(self) -> Self:
        if self.seconds is None:
            return self
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("deadline() must be used inside a task")
        self.task, self.cancelling = task, task.cancelling()
        queues = _queues.get(loop)
        if queues is None:
            queues = _queues[loop] = {}
        queue = queues.get(self.seconds)
        if queue is None:
            queue = queues[self.seconds] = _Queue(loop, self.seconds)
        queue.add(self)
        self.queue = queue
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Any:
        if self.seconds is None:
            return None
        if not self.expired:
            self.queue.remove(self)
            return None
        # the deadline passed while the block ran, and cancelled this task
        if self.task.uncancel() <= self.cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc
        return None


def deadline(seconds: float | None) -> _Deadline:
    """Like ``asyncio.timeout(seconds)`` (None: no deadline) in a plain ``with``, sharing one timer per
    duration between concurrent calls."""
    return _Deadline(seconds)
