"""Rewards named after slime's reward hub, with slime's verdicts (see :mod:`.slime_verdicts`):
``slime_math`` (slime's ``math``), ``deepscaler``, ``dapo``, ``gpqa`` and ``random``."""

from __future__ import annotations

import random as _random
from typing import Any

from .labels import slime_labels
from .normalize import mathd_equal
from .pool import get_pool
from .slime_verdicts import boxed_answer, dapo_score, deepscaler_solution, gold_answer, gpqa_reward

SYMPY_EQUAL = "rlsdk_rm_hub.slime_sympy:sympy_equal"


async def rules_equal(answer: str, gold: str | None, args: Any) -> bool:
    """slime's MATH verdict: MATH-normalized strings equal, or (in a worker, under ``grader_timeout``)
    ``grade_answer_sympy``."""
    if gold is None:
        return False
    if mathd_equal(answer, gold):
        return True
    timeout = float(getattr(args, "grader_timeout", None) or 10.0)
    pool = get_pool(getattr(args, "grader_workers", None))
    return bool(await pool.arun(SYMPY_EQUAL, (answer, gold), timeout))


async def _any_gold(answer: str | None, golds: list[str | None], args: Any) -> float:
    get_pool(getattr(args, "grader_workers", None)).warm()  # imports before the first answer needs them
    if answer is None:
        return 0.0
    for gold in golds:
        if await rules_equal(answer, gold, args):
            return 1.0
    return 0.0


async def slime_math(args: Any, sample: Any, **kwargs: Any) -> float:
    """slime's ``math``: the last ``\\boxed{}`` of the response against the label (boxed or not)."""
    golds = [gold_answer(label, falsy_is_empty=True) for label in slime_labels(sample.label)]
    return await _any_gold(boxed_answer(sample.response or ""), golds, args)


async def deepscaler(args: Any, sample: Any, **kwargs: Any) -> float:
    """DeepScaleR: the last ``\\boxed{}`` after ``</think>`` (or ``###Response``); 0 when neither is there."""
    golds = [gold_answer(label) for label in slime_labels(sample.label)]
    solution = deepscaler_solution(sample.response or "")
    return await _any_gold(boxed_answer(solution) if solution is not None else None, golds, args)


def dapo(args: Any, sample: Any, **kwargs: Any) -> dict[str, Any]:
    """DAPO: ``{"score": 1.0 or -1.0, "acc": bool, "pred": str}`` (train with ``--reward-key score``).
    ``args.dapo_strict_box`` reads the last \\boxed{} instead of ``Answer:``."""
    strict = bool(getattr(args, "dapo_strict_box", False))
    scores = [dapo_score(sample.response or "", gold, strict) for gold in slime_labels(sample.label)]
    return next((s for s in scores if s["acc"]), scores[0])


def gpqa(args: Any, sample: Any, **kwargs: Any) -> float:
    """GPQA multiple choice: the chosen letter against ``metadata.correct_letter`` or the label's."""
    return gpqa_reward(sample.response, sample.label, sample.metadata)


def random(args: Any, sample: Any, **kwargs: Any) -> float:
    """0.0 or 1.0 at random (for testing pipelines)."""
    return float(_random.random() < 0.5)
