"""Rewards with the verdicts of slime's reward hub, written from their documented behaviour:
``slime_math`` and ``deepscaler`` (MATH normalization, then sympy), ``dapo`` (Minerva answers, a dict),
``gpqa`` (a choice letter) and ``random``."""

from __future__ import annotations

import random as _random
import re
import string
from typing import Any

from rlsdk.answers import last_boxed

from .labels import labels
from .normalize import math_normalize, minerva_normalize
from .pool import get_pool

SYMPY_EQUAL = "rlsdk_rm_hub.math_worker:sympy_equal"


async def rules_equal(answer: str, label: str, args: Any) -> bool:
    """MATH-style equivalence: normalized strings match, or (in a worker) sympy finds a zero difference."""
    gold = last_boxed(label)
    gold = label if gold is None else gold
    if math_normalize(answer) == math_normalize(gold):
        return True
    timeout = float(getattr(args, "grader_timeout", None) or 10.0)
    pool = get_pool(getattr(args, "grader_workers", None))
    return bool(await pool.arun(SYMPY_EQUAL, (answer, gold), timeout))


async def slime_math(args: Any, sample: Any, **kwargs: Any) -> float:
    """slime's ``math``: last \\boxed{} of the response vs the label (boxed or not); MATH rules or sympy."""
    return await _score_answer(last_boxed(sample.response or ""), sample.label, args)


async def deepscaler(args: Any, sample: Any, **kwargs: Any) -> float:
    """DeepScaleR: the last \\boxed{} after ``</think>`` (or ``###Response``), 0 when neither is there."""
    response = sample.response or ""
    for marker in ("</think>", "###Response"):
        if marker in response:
            answer = last_boxed(response.split(marker, 1)[1])
            break
    else:
        return 0.0
    return await _score_answer(answer, sample.label, args)


async def _score_answer(answer: str | None, label: Any, args: Any) -> float:
    """1.0 when ``answer`` equals any of the labels under MATH rules or sympy, else 0.0."""
    get_pool(getattr(args, "grader_workers", None)).warm()  # sympy's imports before the first answer needs it
    if answer is None:
        return 0.0
    for gold in labels(label):
        if await rules_equal(answer, gold, args):
            return 1.0
    return 0.0


# ----- dapo ---------------------------------------------------------------------------------------

DAPO_TAIL_CHARS = 300
_MINERVA_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


def dapo_prediction(response: str, strict_box: bool = False) -> str | None:
    """The prediction in the last 300 characters: the last ``Answer: ...`` line (Minerva style), or with
    ``strict_box`` the last \\boxed{}; None when there is none."""
    tail = response[-DAPO_TAIL_CHARS:]
    if strict_box:
        return last_boxed(tail)
    matches = _MINERVA_ANSWER.findall(tail)
    return matches[-1] if matches else None


def dapo(args: Any, sample: Any, **kwargs: Any) -> dict[str, Any]:
    """DAPO: ``{"score": 1.0 or -1.0, "acc": bool, "pred": str}`` (train with ``--reward-key score``).
    ``args.dapo_strict_box`` reads the last \\boxed{} instead of ``Answer:``."""
    pred = dapo_prediction(sample.response or "", bool(getattr(args, "dapo_strict_box", False)))
    normalized = minerva_normalize(pred) if pred is not None else "[INVALID]"
    acc = any(normalized == minerva_normalize(gold) for gold in labels(sample.label)) and pred is not None
    return {"score": 1.0 if acc else -1.0, "acc": acc, "pred": normalized}


# ----- gpqa ---------------------------------------------------------------------------------------

_ANSWER_LETTER = re.compile(r"(?i)answer\s*(?:is|:)?\s*:?\s*\(?\$?\\?(?:boxed\{|text\{)?\(?([A-Z])\b")


def _choice_letters(sample: Any) -> str:
    choices = (sample.metadata or {}).get("choices")
    count = len(choices) if isinstance(choices, (list, dict)) and choices else 4
    return string.ascii_uppercase[:count]


def _correct_letter(sample: Any) -> str | None:
    metadata = sample.metadata or {}
    if metadata.get("correct_letter"):
        return str(metadata["correct_letter"]).strip().upper()
    label = str(sample.label).strip() if sample.label is not None else ""
    if len(label) == 1 and label.isalpha():
        return label.upper()
    choices = metadata.get("choices")
    if isinstance(choices, dict):
        for letter, text in choices.items():
            if str(text).strip() == label:
                return str(letter).upper()
    if isinstance(choices, list) and label in [str(c).strip() for c in choices]:
        return string.ascii_uppercase[[str(c).strip() for c in choices].index(label)]
    return None


def gpqa_letter(response: str, letters: str) -> str | None:
    """The chosen letter: "answer is (X)" first, else the last standalone valid capital letter."""
    for match in reversed(list(_ANSWER_LETTER.finditer(response))):
        if match.group(1).upper() in letters:
            return match.group(1).upper()
    standalone = [m for m in re.findall(r"\b([A-Z])\b", response) if m in letters]
    return standalone[-1] if standalone else None


def gpqa(args: Any, sample: Any, **kwargs: Any) -> float:
    """GPQA multiple choice: 1.0 when the chosen letter is ``metadata.correct_letter`` (or the label's)."""
    correct = _correct_letter(sample)
    return float(correct is not None and gpqa_letter(sample.response or "", _choice_letters(sample)) == correct)


def random(args: Any, sample: Any, **kwargs: Any) -> float:
    """0.0 or 1.0 at random (for testing pipelines)."""
    return float(_random.random() < 0.5)
