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


def slime_labels(label: Any) -> list[Any]:
    """The accepted answers as slime's rewards compare them: unchanged (``""`` and ``0`` included, which
    slime scores 0), several for a list label; only a missing label (None) is the error of :func:`labels`."""
    items = [x for x in label if x is not None] if isinstance(label, (list, tuple)) else [label]
    if not items or items == [None]:
        labels(None)
    return items
