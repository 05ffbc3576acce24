"""A sample's label as the list of accepted answers."""

from __future__ import annotations

from typing import Any


def labels(label: Any) -> list[str]:
    """The accepted answers (a list label gives several). A sample without one is an error, so the
    reward is invalid instead of a silent 0 when the data's label key was not named."""
    items = label if isinstance(label, (list, tuple)) else [label]
    odd = next((x for x in items if isinstance(x, (bool, dict, list, tuple))), None)
    if odd is not None:  # str() of these is no answer: a silent 0 for every response
        raise ValueError(
            f"the sample's label is {type(odd).__name__} {str(odd)[:80]}: expected a string or a number "
            "(or a list of them); check --label-key"
        )
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
