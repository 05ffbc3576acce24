"""The ``search_r1_em`` reward: exact match of the last ``<answer>`` against the golden answers."""

from __future__ import annotations

import re
import string
from typing import Any

from rlsdk import Sample

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def normalize(text: str) -> str:
    """SQuAD-style: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def golden_answers(label: Any) -> list[str]:
    """A label may be one answer, a list, or Search-R1's ``{"target": [...]}``."""
    if isinstance(label, dict):
        label = label.get("target", label.get("golden_answers", []))
    if isinstance(label, str):
        return [label]
    return [str(x) for x in label or []]


def search_r1_em(args: Any, sample: Sample, **kwargs: Any) -> float:
    """1.0 when the last <answer> exactly matches a golden answer, the format score when it does not, 0 without one."""
    if sample.label is None:
        raise ValueError("the sample has no golden answers: name the data's answer key with --label-key")
    answers = ANSWER.findall(sample.response)
    if not answers:
        return 0.0
    predicted = normalize(answers[-1])
    if any(predicted == normalize(gold) for gold in golden_answers(sample.label)):
        return 1.0
    return float(getattr(args, "search_r1_format_score", 0.0))
