"""The sample files of a run (kept, discarded, eval samples), indexed by byte offset: each line's step,
group, reward, length, status, drop reason, dataset and prompt fingerprint, so lists are filtered, sorted and
paged without reading the file, and text is searched a block at a time."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .index import NONE, JsonlIndex

PREVIEW_CHARS = 240
"""Characters of a prompt or response a list shows."""
PROMPT_TAIL_CHARS = 160
"""Characters of the end of a prompt a list shows."""
MAX_QUERY_CHARS = 200
"""The longest text a search takes."""
SORTS = ("order", "reward", "-reward", "length", "-length")
"""Orders a sample list takes: the file's order, or by reward or response length (``-``: descending)."""
TEXT_FIELDS = ("prompt", "response", "label")
"""The fields a text search looks in."""
SPANS = tuple(f"{field}_{end}" for field in TEXT_FIELDS for end in ("start", "end"))
"""Index columns: where each text field's value lies in its line."""
SEARCHES_KEPT = 8
"""Text searches remembered per file (a page of the same search reads no file again)."""


def scalar_reward(reward: Any, key: str | None) -> float | None:
    """A sample's reward as one number (a dict reward's ``key`` value); None when there is none."""
    if isinstance(reward, dict):
        reward = reward.get(key) if key else None
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return None
    return float(reward)


def prompt_key(prompt: Any) -> int:
    """A 63-bit fingerprint of a prompt (a string or chat messages), to match eval prompts across runs."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


def drop_reason(row: dict[str, Any]) -> str | None:
    """Why a discarded sample left its step: the filter's reason, or the failure."""
    metadata: dict[str, Any] = row["metadata"] if isinstance(row.get("metadata"), dict) else {}
    if metadata.get("drop_reason"):
        return str(metadata["drop_reason"])
    if row.get("status") == "failed" or metadata.get("generate_error") or metadata.get("filter_error"):
        return "failed"
    return None


def text_of(value: Any) -> str:
    """A prompt, response or label as text (chat messages as their JSON)."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def preview(value: Any) -> str:
    """The start of a response or label."""
    text = text_of(value)
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"


def prompt_preview(prompt: Any) -> str:
    """The end of a prompt, where a chat template puts the question (the last user message of chat
    messages)."""
    if isinstance(prompt, list):
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        prompt = users[-1].get("content") if users else prompt
    text = text_of(prompt)
    return text if len(text) <= PROMPT_TAIL_CHARS else "…" + text[-PROMPT_TAIL_CHARS:]


def text_pattern(query: str) -> tuple[re.Pattern[bytes], int]:
    """A pattern for ``query`` in any case as a JSONL line holds it, to match against the line in lower
    case: each character as ``json.dumps`` writes it, ASCII-only or not (``ö`` may be ``\\u00f6`` or the
    UTF-8 bytes, ``Ö`` ``\\u00d6``); and the longest match in bytes."""
    parts, longest = [], 0
    for char in query:
        forms = sorted(
            {
                json.dumps(variant, ensure_ascii=ascii_only)[1:-1].encode().lower()
                for variant in {char, char.lower(), char.upper()}
                for ascii_only in (True, False)
            }
        )
        longest += max(map(len, forms))
        parts.append(
            re.escape(forms[0]) if len(forms) == 1 else b"(?:" + b"|".join(map(re.escape, forms)) + b")"
        )
    return re.compile(b"".join(parts)), longest


def text_span(line: bytes, key: str, value: Any) -> tuple[int, int] | None:
    """Where ``value`` (the row's ``key``) lies in ``line``, as the writer encoded it; None when it is
    not found as ``json.dumps`` writes it (the search then reads the line)."""
    if value is None:
        return None
    for ascii_only in (True, False):
        encoded = json.dumps(value, ensure_ascii=ascii_only).encode()
        at = line.find(b'"' + key.encode() + b'": ' + encoded)
        if at >= 0:
            start = at + len(key) + 4
            return start, start + len(encoded)
    return None


@dataclass(frozen=True)
class Filters:
    """What a sample list is narrowed to (each None: any)."""

    step: int | None = None
    group: int | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    status: str | None = None
    reason: str | None = None
    dataset: str | None = None
    text: str | None = None


class SampleFile:
    """One sample file's index: per line its step, group, index, reward, response length, status, drop
    reason, dataset and prompt fingerprint."""

    def __init__(self, path: Path, reward_key: str | None) -> None:
        self.reward_key = reward_key
        self.index = JsonlIndex(
            path,
            self._values,
            ints=("step", "group", "index", "length", "prompt", *SPANS),
            floats=("reward",),
            strings=("status", "reason", "dataset"),
        )
        self.steps: dict[int, list[int]] = {}  # step -> line numbers
        self._stepped = 0  # lines filed in self.steps
        self._searches: OrderedDict[tuple[str, int, int], set[int]] = OrderedDict()

    def _values(self, row: dict[str, Any], line: bytes) -> dict[str, Any]:
        key = self.reward_key
        spans: dict[str, int | None] = {}
        for field in TEXT_FIELDS:
            span = text_span(line, field, row.get(field))
            spans[f"{field}_start"], spans[f"{field}_end"] = span or (None, None)
        return {
            **spans,
            "step": row.get("rollout_id"),
            "group": row.get("group_index"),
            "index": row.get("index"),
            "length": row.get("response_length"),
            "prompt": prompt_key(row.get("prompt", "")),
            "reward": scalar_reward(row.get("reward"), key),
            "status": row.get("status"),
            "reason": drop_reason(row),
            "dataset": row.get("dataset"),
        }

    def refresh(self) -> None:
        if self.index.refresh():
            if self._stepped > len(self.index):  # indexed again from the start
                self.steps, self._stepped = {}, 0
            self._searches.clear()
        steps = self.index.ints["step"]
        for n in range(self._stepped, len(self.index)):
            self.steps.setdefault(steps[n], []).append(n)
        self._stepped = len(self.index)

    def lines(self, filters: Filters) -> list[int]:
        """Numbers of the lines that pass ``filters``, in file order."""
        index = self.index
        candidates: Iterable[int] = (
            self.steps.get(filters.step, []) if filters.step is not None else range(len(index))
        )
        if filters.text:
            found = self._search(filters.text)
            candidates = [n for n in candidates if n in found]
        ints = index.ints
        bounds: list[tuple[Any, float, float]] = []
        for column, low, high in (
            (ints["group"], filters.group, filters.group),
            (index.floats["reward"], filters.min_reward, filters.max_reward),
            (ints["length"], filters.min_length, filters.max_length),
        ):
            if low is not None or high is not None:
                bounds.append((column, -math.inf if low is None else low, math.inf if high is None else high))
        codes = [
            (index.strings[name], index.codes[name].lookup(getattr(filters, name)))
            for name in ("status", "reason", "dataset")
            if getattr(filters, name) is not None
        ]

        def passes(n: int) -> bool:  # a missing value (NONE, NaN) passes no bound
            return all(low <= c[n] <= high and c[n] != NONE for c, low, high in bounds) and all(
                c[n] == code for c, code in codes
            )

        return [n for n in candidates if passes(n)]

    def _search(self, text: str) -> set[int]:
        """Lines whose prompt, response or label holds ``text`` (any case): the file is matched a block at
        a time, and a match counts where it lies within one of those fields' spans (a line whose spans are
        unknown is read and checked)."""
        key = (text, len(self.index), self.index.end)
        if key in self._searches:
            self._searches.move_to_end(key)
            return self._searches[key]
        ints = self.index.ints
        spans = [(ints[f"{field}_start"], ints[f"{field}_end"]) for field in TEXT_FIELDS]
        found: set[int] = set()
        unknown: set[int] = set()
        for n, start, end in self.index.matches(*text_pattern(text)):
            if n in found:
                continue
            if any(starts[n] == NONE for starts, _ in spans):
                unknown.add(n)
            elif any(starts[n] <= start and end <= ends[n] for starts, ends in spans):
                found.add(n)
        checked = sorted(unknown - found)
        wanted = text.lower()
        found.update(
            n
            for n, row in zip(checked, self.index.read_many(checked), strict=True)
            if row is not None and any(wanted in text_of(row.get(k)).lower() for k in TEXT_FIELDS)
        )
        self._searches[key] = found
        if len(self._searches) > SEARCHES_KEPT:
            self._searches.popitem(last=False)
        return found

    def sort(self, lines: list[int], order: str) -> list[int]:
        """``lines`` in ``order`` (:data:`SORTS`); lines without the value go last either way."""
        if order == "order":
            return lines
        name = order.lstrip("-")
        column: Any = self.index.floats["reward"] if name == "reward" else self.index.ints["length"]

        def known(n: int) -> bool:
            return column[n] != NONE and not math.isnan(column[n])

        present = [n for n in lines if known(n)]
        missing = [n for n in lines if not known(n)]
        return sorted(present, key=column.__getitem__, reverse=order.startswith("-")) + missing

    def shown_values(self, n: int) -> dict[str, Any]:
        """Line ``n``'s indexed values a page shows (not the prompt's fingerprint, not the spans)."""
        values = self.index.values(n)
        for name in ("prompt", *SPANS):
            del values[name]
        return values

    def summary(self, n: int, row: dict[str, Any] | None) -> dict[str, Any]:
        """A line as lists show it: its indexed values and the start of its prompt and response."""
        out = {"n": n, **self.shown_values(n)}
        out["bad"] = row is None
        out["prompt"] = prompt_preview(row.get("prompt")) if row else ""
        out["response"] = preview(row.get("response")) if row else ""
        return out

    def summaries(self, lines: list[int]) -> list[dict[str, Any]]:
        return [self.summary(n, row) for n, row in zip(lines, self.index.read_many(lines), strict=True)]
