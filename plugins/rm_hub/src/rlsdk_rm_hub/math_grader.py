"""The ``math`` reward: exact comparison, then math-verify under a budget, behind a fast path and a cache.

For each response: find the final answer (:mod:`.final_answer`), decide it in process when canonical
spellings or plain numbers settle it (:func:`quick_verdict`), else in a worker process
(:func:`.math_worker.grade_pair`, bounded by a timeout: :mod:`.pool`). Verdicts are cached by
(answer, label), and a verdict already being computed is shared, so the 8 responses of a group with 3
distinct answers cost at most 3 worker calls.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import re
import threading
from fractions import Fraction
from typing import Any

from . import exact
from .canonical import canonical
from .final_answer import answer_candidates, is_list
from .labels import labels
from .pool import WorkerError, get_pool

CACHE_SIZE = 100_000
GRADE = "rlsdk_rm_hub.math_worker:grade_pair"
_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?|[+-]?\\frac\{\d+\}\{\d+\}"
_PLAIN_NUMBER = re.compile(f"^(?:{_NUMBER})$")
_RADICAL = re.compile(r"^([+-]?)(\d*)\\sqrt\{?(\d+)\}?$")
_BRACKETED = re.compile(r"^([(\[])([^()\[\]{}]*,[^()\[\]{}]*)([)\]])$")
QUICK_MAX_CHARS = 200


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


def quick_verdict(answer: str, label: str) -> bool | None:
    """True or False when equal canonical spellings, two plain numbers (integers, decimals, fractions),
    simple radicals ``k\\sqrt{n}`` or intervals and tuples of plain numbers settle it exactly; None when
    a worker must decide."""
    a, b = canonical(answer).replace(" ", ""), canonical(label).replace(" ", "")  # math mode ignores spaces
    if not a:
        return False
    if a == b:
        return True
    if len(a) > QUICK_MAX_CHARS or len(b) > QUICK_MAX_CHARS:
        return None
    x, y = _BRACKETED.match(a), _BRACKETED.match(b)
    if x and y:
        xs, ys = x.group(2).split(","), y.group(2).split(",")
        verdicts = [_scalar_verdict(p, q) for p, q in zip(xs, ys)] if len(xs) == len(ys) else [False]
        if None in verdicts:
            return None
        return (x.group(1), x.group(3)) == (y.group(1), y.group(3)) and all(verdicts)
    return _scalar_verdict(a, b)


def _scalar_verdict(a: str, b: str) -> bool | None:
    x, y = _squared_with_sign(a), _squared_with_sign(b)
    return None if x is None or y is None else x == y


def _squared_with_sign(s: str) -> tuple[int, object] | None:
    """(sign, value squared) of a plain number or ``k\\sqrt{n}``, exact; None for anything else."""
    if _PLAIN_NUMBER.match(s):
        value = exact.value(s)
        return ((value > 0) - (value < 0), value * value) if isinstance(value, Fraction) else None
    radical = _RADICAL.match(s)
    if radical:
        k, n = int(radical.group(2) or 1), int(radical.group(3))
        return ((-1 if radical.group(1) == "-" else 1) * (k * n > 0), k * k * n)
    return None


def _plan(response: str, label: Any) -> tuple[bool, list[tuple[str, str]]]:
    """Decide what the fast path can; return (correct, pairs a worker must still judge)."""
    golds = labels(label)
    candidates = answer_candidates(response or "")
    # the final answer against every label; all boxed answers together only against a list label
    pairs = [(c, g) for c in candidates[:1] for g in golds] + [
        (c, g) for c in candidates[1:] for g in golds if is_list(g)
    ]
    pending = []
    for answer, gold in pairs:
        verdict = quick_verdict(answer, gold)
        if verdict:
            return True, []
        if verdict is None:
            pending.append((answer, gold))
    return False, pending


def _submit(pair: tuple[str, str], timeout: float, processes: int | None) -> concurrent.futures.Future[bool]:
    return cache.get_or_submit(pair, lambda: get_pool(processes).submit(GRADE, pair, timeout))


def _options(args: Any) -> tuple[float, int | None]:
    timeout = float(getattr(args, "grader_timeout", None) or 10.0)
    return timeout, getattr(args, "grader_workers", None)


def grade(response: str, label: Any, *, timeout: float = 10.0, processes: int | None = None) -> float:
    """1.0 when the final answer of ``response`` equals ``label`` (or one of a list of labels), else 0.0.
    Blocks the calling thread; raises WorkerError when a worker times out or fails."""
    correct, pending = _plan(response, label)
    if correct:
        return 1.0
    for future in [_submit(pair, timeout, processes) for pair in pending]:
        if future.result():
            return 1.0
    return 0.0


async def math(args: Any, sample: Any, **kwargs: Any) -> float:
    """1.0 if the final answer (boxed or not) is mathematically equal to the label, else 0.0."""
    timeout, processes = _options(args)
    get_pool(processes).warm()  # the first answer a worker must judge need not wait for its imports
    correct, pending = _plan(sample.response, sample.label)
    if correct:
        return 1.0
    futures = [_submit(pair, timeout, processes) for pair in pending]
    # shield: a cancelled caller must not cancel a verdict that other samples share
    results = await asyncio.gather(*(asyncio.shield(asyncio.wrap_future(f)) for f in futures))
    return 1.0 if any(results) else 0.0


__all__ = ["WorkerError", "cache", "grade", "math"]
