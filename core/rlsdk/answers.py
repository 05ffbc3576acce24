"""Finding ``\\boxed{...}`` answers in model output (used by the ``boxed_`` reward prefix and graders)."""

from __future__ import annotations

import re

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def boxed_contents(text: str) -> list[str]:
    """The contents of every ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, in order, braces balanced.

    An unclosed box is ignored. Linear in the length of ``text``.
    """
    found: list[str] = []
    pos = 0
    while True:
        match = _BOXED.search(text, pos)
        if match is None:
            return found
        depth, i = 1, match.end()
        while i < len(text) and depth:
            ch = text[i]
            if ch == "\\":
                i += 2
                continue
            depth += (ch == "{") - (ch == "}")
            i += 1
        if depth:
            return found
        found.append(text[match.end() : i - 1].strip())
        pos = i


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text``, or None when there is none."""
    found = boxed_contents(text)
    return found[-1] if found else None
