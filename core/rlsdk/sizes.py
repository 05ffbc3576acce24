"""Size limits checked before any chat template or tokenizer work: counting characters is cheap, rendering
and tokenizing a 50 MB text is not (seconds of a frozen event loop and gigabytes of memory)."""

from __future__ import annotations

from typing import Any

MAX_CHARS_PER_TOKEN = 32
"""A token is never longer than this many characters for the tokenizers rlsdk meets (a bound, not an
average): a text longer than ``tokens * MAX_CHARS_PER_TOKEN`` cannot fit ``tokens`` tokens."""
DEFAULT_MAX_PROMPT_CHARS = 1 << 20
"""Characters of a prompt (all its messages' text) when no token limit says otherwise."""


def max_prompt_chars(tokens: int | None) -> int:
    """The most characters a prompt of at most ``tokens`` tokens can have (the default without a limit)."""
    return tokens * MAX_CHARS_PER_TOKEN if tokens else DEFAULT_MAX_PROMPT_CHARS


def text_chars(value: Any, limit: int) -> int:
    """Characters in the strings inside ``value`` (nested lists and dicts: chat messages, tools), counted
    until they pass ``limit`` (then some number over it): never slower than one pass over the value."""
    total = 0
    stack = [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
            total += sum(len(k) for k in item if isinstance(k, str))
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total
