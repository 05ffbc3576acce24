"""What a request or a data row may cost, checked before any work: counting is cheap, parsing a body of
millions of tiny values, rendering a chat template over them and tokenizing the result is not (seconds of
a frozen event loop and gigabytes of memory).

Every service route reads its JSON body with :func:`parse_request` under a :class:`Budget`: the body's
bytes, an upper bound of its JSON values counted in the raw bytes before parsing (so a body of millions of
``[]`` or ``1`` never becomes millions of objects), then, where the route walks, renders or keeps what it
gets, the exact values and the nesting depth. Where text is rendered and tokenized, :func:`json_chars`
bounds it (strings, numbers, keys and brackets all count, as a template writes them). A new route picks a
budget (:data:`SMALL` for a few fields) and answers :class:`TooCostly` with 413 and :class:`NotJson` with
400."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

MAX_CHARS_PER_TOKEN = 32
"""A token is never longer than this many characters for the tokenizers rlsdk meets (a bound, not an
average): a text longer than ``tokens * MAX_CHARS_PER_TOKEN`` cannot fit ``tokens`` tokens."""
DEFAULT_MAX_PROMPT_CHARS = 1 << 20
"""Characters of a prompt (all its messages' text) when no token limit says otherwise."""
MAX_DEPTH = 64
"""Nesting depth of a request's JSON where the route walks or renders it (chat messages, tool schemas,
trajectories): JSON schemas and messages nest a handful of levels."""


def max_prompt_chars(tokens: int | None) -> int:
    """The most characters a prompt of at most ``tokens`` tokens can have (the default without a limit)."""
    return tokens * MAX_CHARS_PER_TOKEN if tokens else DEFAULT_MAX_PROMPT_CHARS


class TooCostly(ValueError):
    """A request over its route's :class:`Budget`: answered 413 naming the limit, before any work."""

    status = 413


class NotJson(ValueError):
    """A body that is not standard JSON: answered 400."""

    status = 400


@dataclass(frozen=True)
class Budget:
    """What one request body may cost: ``bytes`` of body, ``values`` JSON values (strings, numbers,
    literals, lists and objects; each key too), and, where the route walks or renders what it gets,
    ``depth`` levels of nesting (None: not walked; JSON's own parser stops at about a thousand)."""

    bytes: int
    values: int
    depth: int | None = MAX_DEPTH


SMALL = Budget(bytes=64 << 10, values=4096, depth=16)
"""Control routes (pause, abort, acknowledge, load an adapter by path, ...): a few fields."""
OFF_LOOP_BYTES = 64 << 10
"""Bodies larger than this are parsed and walked in a worker thread (:func:`parse_request`)."""

_STRUCTURE = (b",", b":", b"[", b"{")


def value_bound(raw: bytes) -> int:
    """An upper bound of the JSON values in ``raw`` from its bytes alone, at the speed of a memory scan:
    each value after the first follows a ``,``, ``:``, ``[`` or ``{`` (those in strings count too: a route's
    budget leaves room for its text)."""
    return sum(raw.count(mark) for mark in _STRUCTURE) + 1


def read_json_body(raw: bytes, budget: Budget, *, standard: bool = False) -> Any:
    """The JSON value of a request body within ``budget``: :class:`TooCostly` over it (before parsing
    where the bytes tell), :class:`NotJson` for a body that is not JSON (``standard``: ``NaN`` and
    ``Infinity`` refused as well). An empty body is ``{}``."""
    if len(raw) > budget.bytes:
        raise TooCostly(
            f"request body of {len(raw):,} bytes is over this route's {budget.bytes:,}-byte limit"
        )
    if not raw.strip():
        return {}
    if value_bound(raw) > budget.values:
        raise TooCostly(
            f"request body holds more than {budget.values:,} JSON values (this route's limit; each ',', ':', "
            "'[' and '{' counts, in strings too)"
        )

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not standard JSON")

    try:
        value = json.loads(raw, parse_constant=refuse) if standard else json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise NotJson(f"request body is not JSON: {str(exc)[:200]}") from None
    if budget.depth is not None:
        measure(value, budget)
    return value


async def parse_request(raw: bytes, budget: Budget, *, standard: bool = False) -> Any:
    """:func:`read_json_body`, in a worker thread for a body over :data:`OFF_LOOP_BYTES` (the walk lets the
    event loop run; the parse is bounded by the budget's values)."""
    if len(raw) <= OFF_LOOP_BYTES:
        return read_json_body(raw, budget, standard=standard)
    return await asyncio.to_thread(read_json_body, raw, budget, standard=standard)


def measure(value: Any, budget: Budget, what: str = "request body") -> None:
    """Walk ``value`` once, stopping at the first limit of ``budget`` it passes (nesting, values):
    :class:`TooCostly` naming it."""
    depth_limit = budget.depth if budget.depth is not None else MAX_DEPTH
    count = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        count += 1
        if depth > depth_limit:
            raise TooCostly(f"{what} nests deeper than {depth_limit} levels (this route's limit)")
        if count > budget.values:
            raise TooCostly(f"{what} holds more than {budget.values:,} JSON values (this route's limit)")
        if isinstance(item, dict):
            count += len(item)  # the keys
            stack.extend((inner, depth + 1) for inner in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((inner, depth + 1) for inner in item)


def json_chars(value: Any, limit: int) -> int:
    """About ``len(json.dumps(value))``: strings (with quotes), numbers' digits, literals, keys and the
    brackets and separators of nested lists and dicts, counted until they pass ``limit`` (then some number
    over it): never slower than one pass over the value, however deep."""
    total = 0
    stack = [value]
    while stack and total <= limit:
        item = stack.pop()
        total += _leaf_chars(item)
        if isinstance(item, dict):
            total += sum(len(k) + 4 if isinstance(k, str) else 8 for k in item)
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            total += len(item)
            stack.extend(item)
    return total


def _leaf_chars(item: Any) -> int:
    """Characters of one value as JSON, its contents left out (a list's or dict's brackets)."""
    if isinstance(item, str):
        return len(item) + 2
    if item is None or isinstance(item, bool):
        return 5
    if isinstance(item, int):
        return item.bit_length() * 3 // 10 + 2  # its digits, without writing them out
    if isinstance(item, float):
        return 24
    return 2
