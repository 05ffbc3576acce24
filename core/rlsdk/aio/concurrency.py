"""Concurrency for the rollout loop's calls, one or more per sample, cheaper than asyncio's own.

:class:`ConcurrencyLimit` bounds concurrent calls as ``asyncio.Semaphore`` does, but ``async with
semaphore`` costs three coroutines per call even when a slot is free, which is nearly always; it takes and
gives a free slot with plain calls and only waits, first come first served, when none is left.
:func:`gather_calls` awaits calls concurrently as ``asyncio.gather`` does, with one task fewer per call.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def gather_calls(calls: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Await ``calls`` concurrently and return their results in order, as ``asyncio.gather`` does, for
    less: the first call runs in the caller's task and each other one in a task of its own, created
    directly (groups of one sample are common, and a task costs a few µs). If the caller is cancelled
    or a call raises, the calls still running are cancelled, and have ended when the error reaches the
    caller."""
    if len(calls) == 1:
        return [await calls[0]]
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(call) for call in calls[1:]]
    try:
        first = await calls[0]
        return [first, *[await task for task in tasks]]
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class ConcurrencyLimit:
    """At most ``limit`` holders at once: ``take_now()`` or ``await take()``, then ``give()``."""

    __slots__ = ("free", "_waiting")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a concurrency limit must be at least 1, got {limit}")
        self.free = limit
        self._waiting: deque[asyncio.Future[None]] = deque()

    def take_now(self) -> bool:
        """Take a slot if one is free (never while tasks wait: ``give`` hands slots to them directly)."""
        if self.free:
            self.free -= 1
            return True
        return False

    async def take(self) -> None:
        """Take a slot, waiting in line for one if needed; a task cancelled while it waits takes none."""
        if self.take_now():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.cancelled():
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
            else:  # handed a slot just as it was cancelled: pass it on
                self.give()
            raise

    def give(self) -> None:
        """Hand the slot to the first task still waiting, or free it."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1
