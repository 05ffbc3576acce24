"""rlsdk.aio.deadlines: asyncio.timeout's behaviour, one timer per duration."""

from __future__ import annotations

import asyncio
import time

import pytest

from rlsdk.aio import deadlines
from rlsdk.aio.deadlines import deadline


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
            with deadline(0.1):
                await asyncio.sleep(10)
        assert asyncio.current_task().cancelling() == 0
        return time.monotonic() - started

    waited, _ = run_counting_timers(main)
    assert 0.1 <= waited < 0.6


def test_concurrent_calls_share_one_timer_and_only_late_ones_time_out():
    async def one(i):
        with deadline(0.3):
            await asyncio.sleep(0.01 if i % 2 else 10)
        return i

    async def main():
        return await asyncio.gather(*(one(i) for i in range(500)), return_exceptions=True)

    results, timers = run_counting_timers(main)
    assert not deadlines._queues  # nothing kept for the loop once its calls are over
    assert [isinstance(r, TimeoutError) for r in results] == [i % 2 == 0 for i in range(500)]
    sleeps = 500  # asyncio.sleep sets one timer per call
    # one timer for the oldest call, set again for later calls no sooner than RESOLUTION after it went off
    assert timers - sleeps <= 10


def test_a_cancellation_from_elsewhere_is_not_turned_into_a_timeout():
    async def guarded():
        with deadline(10):
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
        with deadline(None):
            await asyncio.sleep(0)
        return "done"

    assert run_counting_timers(main) == ("done", 0)


def test_each_call_expires_at_its_own_deadline_and_durations_do_not_mix():
    async def guarded(seconds, delay, log):
        await asyncio.sleep(delay)
        started = time.monotonic()
        try:
            with deadline(seconds):
                await asyncio.sleep(10)
        except TimeoutError:
            log.append((seconds, delay, time.monotonic() - started))

    async def main():
        log = []
        await asyncio.gather(guarded(0.2, 0.0, log), guarded(0.2, 0.1, log), guarded(0.05, 0.1, log))
        return log

    log, _ = run_counting_timers(main)
    assert [(seconds, delay) for seconds, delay, _ in log] == [(0.05, 0.1), (0.2, 0.0), (0.2, 0.1)]
    for seconds, _, waited in log:  # the later 0.2 s call is not cut short by the earlier one's timer
        assert seconds <= waited < seconds + 0.1
    assert not deadlines._queues


def test_calls_one_at_a_time_share_the_timer_and_leave_nothing_behind():
    async def main():
        for _ in range(100):
            with deadline(10):
                await asyncio.sleep(0)
        await asyncio.sleep(0)  # the queue looks again once the loop has run what was ready
        return dict(deadlines._queues)

    left, timers = run_counting_timers(main)
    assert (left, timers) == ({}, 1)
