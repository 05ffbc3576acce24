"""The blocking pool (sync rewards and tools), real threads: a stuck call is abandoned, not waited for."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rlsdk.aio.blocking import BlockingPool, PoolExhausted


async def abandon_a_stuck_call(pool: BlockingPool, release: threading.Event) -> None:
    """A call that blocks until ``release``, given up by its caller (a timeout) once a thread runs it: a
    call given up while still queued never runs, which a loaded machine would make of it."""
    entered = threading.Event()

    def stuck() -> None:
        entered.set()
        release.wait()

    call = asyncio.ensure_future(pool.run(stuck))
    while not entered.is_set():
        await asyncio.sleep(0.01)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(call, 0.05)


def test_stuck_calls_are_abandoned_and_later_calls_still_run():
    pool = BlockingPool(workers=2, max_abandoned=3)
    release = threading.Event()

    async def scenario():
        for _ in range(2):  # both workers stuck: the old default executor would queue everything behind them
            await abandon_a_stuck_call(pool, release)
        started = time.perf_counter()
        results = await asyncio.gather(*(pool.run(lambda n=n: n * n) for n in range(10)))
        return results, time.perf_counter() - started

    results, seconds = asyncio.run(scenario())
    assert results == [n * n for n in range(10)] and seconds < 2
    assert pool.abandoned == 2
    release.set()  # the stuck calls return: their threads rejoin (or leave), nothing is delivered
    deadline = time.monotonic() + 5
    while pool.abandoned and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.abandoned == 0


def test_exhaustion_is_reported_not_queued():
    pool = BlockingPool(workers=1, max_abandoned=2, name="reward threads")
    release = threading.Event()

    async def scenario():
        for _ in range(2):
            await abandon_a_stuck_call(pool, release)
        with pytest.raises(PoolExhausted, match="all 2 threads of reward threads .* are stuck"):
            await pool.run(time.sleep, 0)

    asyncio.run(scenario())
    release.set()


def test_errors_and_context_reach_the_caller():
    import contextvars

    var = contextvars.ContextVar("var", default="unset")
    pool = BlockingPool(workers=1)

    async def scenario():
        var.set("caller's")
        with pytest.raises(ZeroDivisionError):
            await pool.run(lambda: 1 / 0)
        return await pool.run(var.get)

    assert asyncio.run(scenario()) == "caller's"
