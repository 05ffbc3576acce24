"""The ``math`` reward: math-verify's equivalence behind an exact fast path and a verdict cache.

For each response: find the final answer (:mod:`.final_answer`), decide it in process when normalized
strings or plain numbers settle it (:func:`.normalize.fast_verdict`), else ask math-verify in a worker
process (:mod:`.pool`). Verdicts are cached by (answer, label), and a verdict already being computed is
shared, so the 8 responses of a group with 3 distinct answers cost at most 3 math-verify calls.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from typing import Any

from .final_answer import answer_candidates
from .labels import labels
from .normalize import fast_verdict
from .pool import WorkerError, get_pool

CACHE_SIZE = 100_000
MATH_VERIFY = "rlsdk_rm_hub.math_worker:math_verify_equal"


class VerdictCache:
    """A bounded LRU map from (answer, label) to a future verdict, safe across threads."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._items: collections.OrderedDict[tuple[str, str], concurrent.futures.Future[bool]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()

    def get_or_submit(self, key: tuple[str, str], submit: Any) -> concurrent.futures.Future[bool]:
        with self._lock:
            future = self._items.get(key)
            if future is not None:
                self._items.move_to_end(key)
                return future
            future = self._items[key] = submit()
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        future.add_done_callback(lambda f: self._forget_failure(key, f))
        return future

    def _forget_failure(self, key: tuple[str, str], future: concurrent.futures.Future[bool]) -> None:
        if future.cancelled() or future.exception() is not None:  # retry failures next time
            with self._lock:
                if self._items.get(key) is future:
                    del self._items[key]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


cache = VerdictCache()


def _plan(response: str, label: Any) -> tuple[bool, list[tuple[str, str]]]:
    """Decide what the fast path can; return (correct, pairs math-verify must still judge)."""
    pending = []
    golds = labels(label)
    for answer in answer_candidates(response or ""):
        for gold in golds:
            verdict = fast_verdict(answer, gold)
            if verdict:
                return True, []
            if verdict is None:
                pending.append((answer, gold))
    return False, pending


def _submit(pair: tuple[str, str], timeout: float, processes: int | None) -> concurrent.futures.Future[bool]:
    return cache.get_or_submit(pair, lambda: get_pool(processes).submit(MATH_VERIFY, pair, timeout))


def _options(args: Any) -> tuple[float, int | None]:
    timeout = float(getattr(args, "grader_timeout", None) or 10.0)
    return timeout, getattr(args, "grader_workers", None)


def grade(response: str, label: Any, *, timeout: float = 10.0, processes: int | None = None) -> float:
    """1.0 when the final answer of ``response`` equals ``label`` (or one of a list of labels), else 0.0.
    Blocks the calling thread; raises WorkerError when math-verify times out or fails."""
    correct, pending = _plan(response, label)
    if correct:
        return 1.0
    for future in [_submit(pair, timeout, processes) for pair in pending]:
        if future.result():
            return 1.0
    return 0.0


async def math(args: Any, sample: Any, **kwargs: Any) -> float:
    """1.0 if the final answer (boxed or not) is mathematically equal to the label, by math-verify."""
    timeout, processes = _options(args)
    get_pool(processes).warm()  # the first answer math-verify must judge need not wait for its imports
    correct, pending = _plan(sample.response, sample.label)
    if correct:
        return 1.0
    futures = [_submit(pair, timeout, processes) for pair in pending]
    # shield: a cancelled caller must not cancel a verdict that other samples share
    results = await asyncio.gather(*(asyncio.shield(asyncio.wrap_future(f)) for f in futures))
    return 1.0 if any(results) else 0.0


__all__ = ["WorkerError", "cache", "grade", "math"]
