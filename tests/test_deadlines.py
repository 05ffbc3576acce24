"""rlsdk.deadlines: asyncio.timeout's behaviour on shared timers."""

from __future__ import annotations

import asyncio
import time

import pytest

from rlsdk import deadlines
from rlsdk.deadlines import GRANULARITY, deadline


def run_counting_timers(main):
    """Run ``main()`` on a fresh loop; return its result and how many timers it set."""
    loop = asyncio.new_event_loop()
    calls = []
    call_at = loop.call_at

    def counting(when, callback, *args, **kwargs):
        calls.append(when)
        return call_at(when, callback, *args, **kwargs)

    loop.call_at = counting
    try:
        return loop.run_until_complete(main()), len(calls)
    finally:
        loop.close()


def test_a_call_past_its_deadline_raises_timeout_error_and_its_task_is_not_left_cancelled():
    async def main():
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            async with deadline(0.1):
                await asyncio.sleep(10)
        assert asyncio.current_task().cancelling() == 0
        return time.monotonic() - started

    waited, _ = run_counting_timers(main)
    assert 0.1 <= waited < 0.1 + GRANULARITY + 0.5


def test_concurrent_calls_share_one_timer_and_only_late_ones_time_out():
    async def one(i):
        async with deadline(0.3):
            await asyncio.sleep(0.01 if i % 2 else 10)
        return i

    async def main():
        return await asyncio.gather(*(one(i) for i in range(500)), return_exceptions=True)

    results, timers = run_counting_timers(main)
    assert not deadlines._open  # every bucket closed: nothing kept for the loop
    assert [isinstance(r, TimeoutError) for r in results] == [i % 2 == 0 for i in range(500)]
    sleeps = 500  # asyncio.sleep sets one timer per call
    assert timers - sleeps <= 2  # one shared deadline (two if the calls straddle a rounding boundary)


def test_a_cancellation_from_elsewhere_is_not_turned_into_a_timeout():
    async def guarded():
        async with deadline(10):
            await asyncio.sleep(10)

    async def main():
        task = asyncio.create_task(guarded())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run_counting_timers(main)


def test_no_deadline_sets_no_timer():
    async def main():
        async with deadline(None):
            await asyncio.sleep(0)
        return "done"

    assert run_counting_timers(main) == ("done", 0)
