"""A sample's label as the list of accepted answers."""

from __future__ import annotations

from typing import Any


def labels(label: Any) -> list[str]:
    """The accepted answers (a list label gives several). A sample without one is an error, so the
    reward is invalid instead of a silent 0 when the data's label key was not named."""
    items = label if isinstance(label, (list, tuple)) else [label]
    answers = [str(x).strip() for x in items if x is not None and str(x).strip()]
    if not answers:
        raise ValueError("the sample has no label: name the data's answer key with --label-key")
    return answers
