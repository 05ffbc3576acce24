"""slime's ``rm_hub.deepscaler`` names."""

from __future__ import annotations

from typing import Any

from ..normalize import mathd_equal
from ..slime_sympy import sympy_equal
from ..slime_verdicts import boxed_answer, deepscaler_solution, gold_answer


def get_deepscaler_rule_based_reward(response: str, label: Any) -> int:
    """DeepScaleR's verdict, in process: 1 or 0."""
    solution = deepscaler_solution(response)
    answer = boxed_answer(solution) if solution is not None else None
    gold = gold_answer(label)
    if answer is None or gold is None:
        return 0
    return int(mathd_equal(answer, gold) or sympy_equal(answer, gold))
