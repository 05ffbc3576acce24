"""SQuAD-style token F1 between a response and its label, with slime's verdicts."""

from __future__ import annotations

import collections
import re
import string
from typing import Any

from .labels import slime_labels

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
_EXACT_ONLY = ("yes", "no", "noanswer")
ZERO = (0, 0, 0)


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation and articles, collapse whitespace (SQuAD's normalization)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def f1_score(prediction: str | None, truth: str) -> tuple[float, float, float]:
    """(F1, precision, recall) of the normalized tokens; ``(0, 0, 0)`` for no prediction, no overlap, or a
    yes/no/noanswer on either side that is not matched exactly (slime's rule)."""
    if prediction is None:
        return ZERO
    pred, gold = normalize_answer(prediction), normalize_answer(truth)
    if (pred in _EXACT_ONLY or gold in _EXACT_ONLY) and pred != gold:
        return ZERO
    pred_tokens, gold_tokens = pred.split(), gold.split()
    overlap = sum((collections.Counter(pred_tokens) & collections.Counter(gold_tokens)).values())
    if overlap == 0:
        return ZERO
    precision, recall = overlap / len(pred_tokens), overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


def f1(args: Any, sample: Any, **kwargs: Any) -> float:
    """SQuAD token F1 of the response against the label (the best of several labels)."""
    return float(max(f1_score(sample.response, str(label))[0] for label in slime_labels(sample.label)))
