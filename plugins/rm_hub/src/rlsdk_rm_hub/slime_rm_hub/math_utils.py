"""slime's ``rm_hub.math_utils`` names (MATH normalization, boxed answers, mathd and sympy grading)."""

from __future__ import annotations

from typing import Any

from ..normalize import math_normalize as _strip_string
from ..normalize import mathd_equal as grade_answer_mathd
from ..normalize import mathd_normalize as mathd_normalize_answer
from ..slime_sympy import sympy_equal as grade_answer_sympy
from ..slime_sympy import sympy_normalize as _normalize
from ..slime_verdicts import boxed_answer as extract_answer
from ..slime_verdicts import gold_answer, unbox
from ..slime_verdicts import last_boxed_span as last_boxed_only_string

__all__ = [
    "_normalize",
    "_strip_string",
    "extract_answer",
    "extract_boxed_answer",
    "grade_answer_mathd",
    "grade_answer_sympy",
    "grade_answer_verl",
    "last_boxed_only_string",
    "mathd_normalize_answer",
    "remove_boxed",
]


def remove_boxed(s: str | None) -> str | None:
    """The inside of ``\\boxed{...}``, None for anything else."""
    return unbox(s) if isinstance(s, str) else None


def extract_boxed_answer(solution: str) -> str | None:
    """The inside of the last ``\\boxed{}``."""
    return unbox(last_boxed_only_string(solution))


def grade_answer_verl(solution_str: str, ground_truth: Any) -> bool:
    """slime's ``math`` verdict, in process: the response's last boxed answer against the label."""
    gold, given = gold_answer(ground_truth, falsy_is_empty=True), extract_answer(solution_str)
    if gold is None or given is None:
        return False
    return grade_answer_mathd(given, gold) or grade_answer_sympy(given, gold)
