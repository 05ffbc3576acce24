"""Reading rows from JSONL and Parquet files, with ``path@[start:end]`` row slices and a bad-row policy."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DataError

log = logging.getLogger("rlsdk.data")

_SLICE = re.compile(r"^(?P<path>.+)@\[(?P<start>-?\d*):(?P<end>-?\d*)\]$")
FORMATS = (".jsonl", ".parquet")
_WARN_LIMIT = 5


@dataclass(frozen=True)
class DataPath:
    """A data file and an optional Python-style row slice, parsed from ``path@[start:end]``."""

    path: Path
    start: int | None = None
    end: int | None = None

    @classmethod
    def parse(cls, spec: str | Path) -> DataPath:
        """``data.jsonl@[10:-5]`` selects rows 10 up to the fifth from last; no slice selects all."""
        match = _SLICE.match(str(spec))
        if match is None:
            return cls(Path(spec))
        start, end = match["start"], match["end"]
        return cls(Path(match["path"]), int(start) if start else None, int(end) if end else None)

    def rows_in(self, count: int) -> range:
        """The 0-based row numbers this slice selects out of ``count`` rows."""
        return range(count)[slice(self.start, self.end)]

    def __str__(self) -> str:
        if self.start is None and self.end is None:
            return str(self.path)
        return (
            f"{self.path}@[{'' if self.start is None else self.start}:{'' if self.end is None else self.end}]"
        )


@dataclass
class Row:
    """One data row and where it came from (``file:line N`` or ``file:row N``), for error messages."""

    values: dict[str, Any]
    where: str


class BadRowPolicy:
    """``on_bad_row="error"`` raises a DataError naming the row; ``"skip"`` counts it and warns."""

    def __init__(self, on_bad_row: str) -> None:
        if on_bad_row not in ("error", "skip"):
            raise ValueError(f"on_bad_row must be error or skip, got {on_bad_row!r}")
        self.on_bad_row = on_bad_row
        self.skipped = 0

    def report(self, where: str, problem: str) -> None:
        if self.on_bad_row == "error":
            raise DataError(f"{where}: {problem} (set on_bad_row: skip to skip and count bad rows)")
        self.skipped += 1
        if self.skipped <= _WARN_LIMIT:
            log.warning("skipped bad row %s: %s", where, problem)


def read_rows(data_path: DataPath, bad: BadRowPolicy) -> list[Row]:
    """The rows of a JSONL or Parquet file within the slice; bad rows go through ``bad``."""
    path = data_path.path
    if path.is_dir():
        raise DataError(f"{str(path)!r} is a folder, not a data file: name a .jsonl or .parquet file in it")
    if not path.is_file():
        raise DataError(f"data file {str(path)!r} does not exist")
    if path.suffix == ".jsonl":
        return _read_jsonl(data_path, bad)
    if path.suffix == ".parquet":
        return _read_parquet(data_path, bad)
    raise DataError(f"{path}: unknown data format {path.suffix!r}; use one of {', '.join(FORMATS)}")


def _read_jsonl(data_path: DataPath, bad: BadRowPolicy) -> list[Row]:
    lines = data_path.path.read_bytes().splitlines()  # decoded line by line: one bad byte is one bad row
    numbered = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    rows = []
    for position in data_path.rows_in(len(numbered)):
        number, raw = numbered[position]
        where = f"{data_path.path}:line {number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad.report(where, f"not UTF-8 text: {exc}")
            continue
        try:
            values = json.loads(line)
        except json.JSONDecodeError as exc:
            bad.report(where, f"malformed JSON: {exc}")
            continue
        if not isinstance(values, dict):
            bad.report(where, f"expected a JSON object, got {type(values).__name__}")
            continue
        rows.append(Row(values, where))
    return rows


def _read_parquet(data_path: DataPath, bad: BadRowPolicy) -> list[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(data_path.path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{data_path.path}: cannot read Parquet: {exc}") from exc
    selected = data_path.rows_in(table.num_rows)
    values = table.slice(selected.start, len(selected)).to_pylist() if selected else []
    return [Row(row, f"{data_path.path}:row {number + 1}") for number, row in zip(selected, values)]


def checked_rows(data_path: DataPath, bad: BadRowPolicy, input_key: str, flag: str) -> list[Row]:
    """The rows of ``data_path`` that have ``input_key`` (``flag`` names it); a missing or empty file, or one
    whose every row lacks the key, is an error."""
    rows = read_rows(data_path, bad)
    if not rows:
        raise DataError(f"{data_path}: the dataset has no rows")
    missing = [row for row in rows if row.values.get(input_key) is None]
    for row in missing:  # a prompt needs its input key: said before the model loads
        bad.report(row.where, f"no input key {input_key!r} (keys: {sorted(row.values)}; {flag} names it)")
    if len(missing) == len(rows):
        raise DataError(f"{data_path}: no row has the input key {input_key!r} ({flag} names it)")
    return [row for row in rows if row.values.get(input_key) is not None]
