"""rlsdk.aio.concurrency: ConcurrencyLimit (asyncio.Semaphore's bound, first come first served, no slot lost)
and gather_calls (asyncio.gather's results and cancellation)."""

from __future__ import annotations

import asyncio

import pytest

from rlsdk.aio.concurrency import ConcurrencyLimit, gather_calls


async def hold(limit, inside, log, name, seconds=0.01):
    if not limit.take_now():
        await limit.take()
    try:
        inside.append(name)
        log.append(len(inside))
        await asyncio.sleep(seconds)
    finally:
        inside.remove(name)
        limit.give()
    return name


def test_at_most_limit_holders_in_order_and_every_slot_back():
    async def main():
        limit, inside, log, order = ConcurrencyLimit(3), [], [], []

        async def one(i):
            await hold(limit, inside, log, i)
            order.append(i)

        await asyncio.gather(*(one(i) for i in range(20)))
        return limit.free, max(log), order

    free, most, order = asyncio.run(main())
    assert (free, most) == (3, 3)
    assert order[:3] == [0, 1, 2] and sorted(order) == list(range(20))


def test_a_task_cancelled_while_waiting_takes_no_slot():
    async def main():
        limit, inside, log = ConcurrencyLimit(1), [], []
        first = asyncio.create_task(hold(limit, inside, log, "first", 0.05))
        await asyncio.sleep(0)
        waiting = asyncio.create_task(hold(limit, inside, log, "cancelled"))
        later = asyncio.create_task(hold(limit, inside, log, "later"))
        await asyncio.sleep(0.01)
        waiting.cancel()
        results = await asyncio.gather(first, waiting, later, return_exceptions=True)
        return limit.free, results

    free, results = asyncio.run(main())
    assert free == 1
    assert results[0] == "first" and isinstance(results[1], asyncio.CancelledError) and results[2] == "later"


def test_a_slot_handed_to_a_task_cancelled_before_it_runs_is_passed_on():
    async def main():
        limit = ConcurrencyLimit(1)
        assert limit.take_now()
        handed = asyncio.create_task(limit.take())
        after = asyncio.create_task(limit.take())
        await asyncio.sleep(0)  # both wait in line
        limit.give()  # the slot goes to `handed`...
        handed.cancel()  # ...which is cancelled before it runs again
        with pytest.raises(asyncio.CancelledError):
            await handed
        await asyncio.wait_for(after, 1)  # so `after` gets it
        limit.give()
        return limit.free

    assert asyncio.run(main()) == 1


def test_a_limit_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        ConcurrencyLimit(0)


def test_gather_calls_returns_results_in_order_and_runs_calls_concurrently():
    async def call(i):
        await asyncio.sleep(0.05 * (3 - i))
        return i

    async def main():
        loop = asyncio.get_running_loop()
        started = loop.time()
        results = await gather_calls([call(i) for i in range(3)])
        return results, loop.time() - started

    results, seconds = asyncio.run(main())
    assert results == [0, 1, 2] and seconds < 0.25  # one after another would take 0.3 s


def test_a_cancelled_gather_calls_ends_its_calls_before_the_caller_sees_it():
    ended = []

    async def call(i):
        try:
            await asyncio.sleep(10)
        finally:
            await asyncio.sleep(0)  # clean-up that takes a turn of the loop
            ended.append(i)

    async def main():
        task = asyncio.create_task(gather_calls([call(i) for i in range(3)]))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return sorted(ended)

    assert asyncio.run(main()) == [0, 1, 2]
