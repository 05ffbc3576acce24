"""The local ``search`` tool: the notes that share the most words with the query, from a shipped file."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

NOTES = Path(__file__).parent / "data" / "notes.jsonl"


@cache
def _notes(path: Path = NOTES) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def search(query: str, limit: int = 1) -> str:
    """The ``limit`` notes sharing the most words with ``query`` (title words count twice), or a miss."""
    asked = _words(query)
    scored = sorted(
        (
            (2 * len(asked & _words(n["title"])) + len(asked & _words(n["text"])), i)
            for i, n in enumerate(_notes())
        ),
        reverse=True,
    )
    found = [_notes()[i]["text"] for score, i in scored[:limit] if score > 0]
    return "\n".join(found) if found else "No notes match that query."
