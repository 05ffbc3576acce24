"""SQuAD-style token F1 between a response and its label."""

from __future__ import annotations

import collections
import re
import string
from typing import Any

from .labels import labels

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation and articles, collapse whitespace (SQuAD's normalization)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def f1_score(prediction: str, truth: str) -> float:
    """Token-overlap F1 of the normalized strings; two empty strings score 1."""
    pred_tokens = normalize_answer(prediction).split()
    truth_tokens = normalize_answer(truth).split()
    if not pred_tokens or not truth_tokens:
        return float(pred_tokens == truth_tokens)
    common = collections.Counter(pred_tokens) & collections.Counter(truth_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def f1(args: Any, sample: Any, **kwargs: Any) -> float:
    """SQuAD token F1 of the response against the label (the best of several labels)."""
    return max(f1_score(sample.response, label) for label in labels(sample.label))
