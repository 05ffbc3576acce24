"""A JSONL file of a run, indexed by byte offset as it grows, so a page reads only the lines it shows.

The index keeps each complete line's offset and length and a few numbers per line (step, group, reward,
length, ...) in compact arrays; :meth:`JsonlIndex.refresh` reads only what was appended since the last
call. A line still being written (no newline yet) waits for the next refresh. A file that was replaced
(``--overwrite``) or cut back (``--resume`` truncates what a crash wrote past the saved state) is indexed
again from its start.
"""

from __future__ import annotations

import json
import math
import os
import re
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

READ_BLOCK = 1 << 20
"""Bytes read at a time when indexing or searching."""
CHECK_BYTES = 64
"""Bytes before the indexed end compared on each refresh: other bytes there mean the file was rewritten."""
NONE = -(2**31)
"""An integer column's value for a line without that field."""


@dataclass
class Codes:
    """Strings of a column (status, dataset, drop reason) as small integers."""

    names: list[str] = field(default_factory=list)
    _codes: dict[str, int] = field(default_factory=dict)

    def code(self, name: str | None) -> int:
        if name is None:
            return -1
        if name not in self._codes:
            self._codes[name] = len(self.names)
            self.names.append(name)
        return self._codes[name]

    def lookup(self, name: str) -> int:
        """The code of ``name``; -2 (no line's) when no line has it."""
        return self._codes.get(name, -2)

    def name(self, code: int) -> str | None:
        return None if code < 0 else self.names[code]


Extract = Callable[[dict[str, Any], bytes], dict[str, Any]]
"""A row's indexed values from the row and its line's bytes: numbers (int or float columns) and strings
(coded columns), by column name."""


class JsonlIndex:
    """Offsets and indexed columns of the complete lines of one JSONL file (see the module's docstring).

    ``ints``, ``floats`` and ``strings`` name the columns ``extract`` fills; a line that is not a JSON
    object is indexed too (its number in :attr:`bad_lines`), with no values."""

    def __init__(
        self,
        path: Path,
        extract: Extract,
        ints: Iterable[str] = (),
        floats: Iterable[str] = (),
        strings: Iterable[str] = (),
    ) -> None:
        self.path = path
        self.extract = extract
        self.int_names, self.float_names, self.string_names = tuple(ints), tuple(floats), tuple(strings)
        self._reset()

    def _reset(self) -> None:
        self.offsets = array("q")
        self.lengths = array("l")
        self.ints = {name: array("l") for name in self.int_names}
        self.floats = {name: array("d") for name in self.float_names}
        self.codes = {name: Codes() for name in self.string_names}
        self.strings = {name: array("l") for name in self.string_names}
        self.bad_lines: list[int] = []
        self.end = 0  # bytes indexed: the end of the last complete line
        self.partial = 0  # bytes after it (a line being written)
        self._inode: int | None = None
        self._tail = b""

    def __len__(self) -> int:
        return len(self.offsets)

    def refresh(self) -> bool:
        """Index what was appended since the last call; whether anything changed."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            changed = bool(self.offsets) or self._inode is not None
            if changed:
                self._reset()
            return changed
        reset = self._inode not in (None, stat.st_ino) or stat.st_size < self.end or not self._same_tail()
        if reset:
            self._reset()
        self._inode = stat.st_ino
        if stat.st_size == self.end + self.partial and not reset:
            return False
        with open(self.path, "rb") as f:
            f.seek(self.end)
            carry = b""
            position = self.end
            while block := f.read(READ_BLOCK):
                block = carry + block
                start = 0
                while (newline := block.find(b"\n", start)) >= 0:
                    self._add(position + start, block[start:newline])
                    start = newline + 1
                position += start
                carry = block[start:]
            self.end, self.partial = position, len(carry)
        if self.end:
            self._tail = self._read_tail()
        return True

    def _read_tail(self) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(max(0, self.end - CHECK_BYTES))
            return f.read(min(CHECK_BYTES, self.end))

    def _same_tail(self) -> bool:
        return not self.end or self._read_tail() == self._tail

    def _add(self, offset: int, line: bytes) -> None:
        n = len(self.offsets)
        self.offsets.append(offset)
        self.lengths.append(len(line))
        try:
            row = json.loads(line)
            values = self.extract(row, line) if isinstance(row, dict) else None
        except (ValueError, TypeError, KeyError):
            values = None
        if values is None:
            self.bad_lines.append(n)
            values = {}
        for name, column in self.ints.items():
            value = values.get(name)
            column.append(NONE if value is None else int(value))
        for name, floats in self.floats.items():
            value = values.get(name)
            floats.append(math.nan if value is None else float(value))
        for name, coded in self.strings.items():
            coded.append(self.codes[name].code(values.get(name)))

    def int_value(self, name: str, n: int) -> int | None:
        value = self.ints[name][n]
        return None if value == NONE else value

    def float_value(self, name: str, n: int) -> float | None:
        value = self.floats[name][n]
        return None if math.isnan(value) else value

    def string_value(self, name: str, n: int) -> str | None:
        return self.codes[name].name(self.strings[name][n])

    def values(self, n: int) -> dict[str, Any]:
        """Line ``n``'s indexed values."""
        out: dict[str, Any] = {name: self.int_value(name, n) for name in self.int_names}
        out.update({name: self.float_value(name, n) for name in self.float_names})
        out.update({name: self.string_value(name, n) for name in self.string_names})
        return out

    def read(self, n: int) -> dict[str, Any] | None:
        """Line ``n`` parsed (None when it is not a JSON object)."""
        return next(iter(self.read_many([n])))

    def read_many(self, numbers: Iterable[int]) -> Iterator[dict[str, Any] | None]:
        """The lines ``numbers`` parsed, in that order, reading only their bytes."""
        with open(self.path, "rb") as f:
            for n in numbers:
                f.seek(self.offsets[n])
                try:
                    row = json.loads(f.read(self.lengths[n]))
                except ValueError:
                    row = None
                yield row if isinstance(row, dict) else None

    def matches(self, pattern: re.Pattern[bytes], longest: int) -> Iterator[tuple[int, int, int]]:
        """Each match of ``pattern`` in the indexed lines, read a block at a time and matched on the
        block in lower case (ASCII), so ``pattern`` must be lower case: (line number, start, end) with
        start and end within the line. A match is at most ``longest`` bytes; one found twice where blocks
        overlap is given once."""
        overlap = max(longest - 1, 0)
        seen_to = -1
        with open(self.path, "rb") as f:
            position = 0
            while position < self.end:
                block = f.read(min(READ_BLOCK, self.end - position)).lower()
                if not block:
                    break
                for match in pattern.finditer(block):
                    start = position + match.start()
                    if start <= seen_to:
                        continue
                    seen_to = start
                    n = bisect_right(self.offsets, start) - 1
                    yield n, start - self.offsets[n], position + match.end() - self.offsets[n]
                position += len(block)
                if position < self.end and overlap:
                    position -= overlap
                    f.seek(position)
