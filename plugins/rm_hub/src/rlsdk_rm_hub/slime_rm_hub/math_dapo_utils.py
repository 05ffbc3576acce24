"""slime's ``rm_hub.math_dapo_utils`` names (Minerva normalization, DAPO's score)."""

from __future__ import annotations

from typing import Any

from ..normalize import minerva_normalize as normalize_final_answer
from ..slime_verdicts import (
    MINERVA_ANSWER,
    STRICT_BOX_TAIL_CHARS,
    dapo_score,
    last_boxed_span,
    minerva_correct,
    strict_box_correct,
)

__all__ = [
    "compute_score",
    "is_correct_minerva",
    "is_correct_strict_box",
    "last_boxed_only_string",
    "normalize_final_answer",
    "remove_boxed",
    "verify",
]


def last_boxed_only_string(string: str) -> str | None:
    """The last ``\\boxed{...}`` (``\\fbox`` is not looked for here)."""
    return last_boxed_span(string, fbox=False)


def remove_boxed(s: str) -> str:
    """The inside of ``\\boxed{...}``; AssertionError for anything else."""
    if not (s.startswith("\\boxed{") and s.endswith("}")):
        raise AssertionError(f"box error: {s}")
    return s[len("\\boxed{") : -1]


def is_correct_minerva(
    solution_str: str, gt: Any, gt_need_extract: bool = False, answer_pattern: str = MINERVA_ANSWER.pattern
) -> tuple[bool, str]:
    """Minerva's check: the last ``Answer:`` line against the label read as an integer."""
    if answer_pattern != MINERVA_ANSWER.pattern:
        raise NotImplementedError("rlsdk's is_correct_minerva reads only the default 'Answer:' pattern")
    if gt_need_extract:
        boxed = last_boxed_only_string(gt)
        if boxed is None:
            raise ValueError(f"gt_need_extract: the label {gt[:100]!r} has no \\boxed{{}}")
        gt = remove_boxed(boxed)
    return minerva_correct(solution_str, gt)


def is_correct_strict_box(pred: str, gt: Any, pause_tokens_index: list[int] | None = None) -> tuple[int, Any]:
    """The last ``\\boxed{}`` of the last 100 characters equal to the label: 1, else -1."""
    if pause_tokens_index is not None:
        if len(pause_tokens_index) != 4:
            raise AssertionError("pause_tokens_index needs 4 entries")
        return strict_box_correct(pred[pause_tokens_index[-1] - 100 :], gt)
    return strict_box_correct(pred[-STRICT_BOX_TAIL_CHARS:], gt)


def verify(
    solution_str: str,
    answer: Any,
    strict_box_verify: bool = False,
    pause_tokens_index: list[int] | None = None,
) -> tuple[bool, Any]:
    """(correct, prediction) by strict box or by Minerva."""
    if strict_box_verify:
        score, pred = is_correct_strict_box(solution_str, answer, pause_tokens_index)
        return score == 1, pred
    return is_correct_minerva(solution_str, answer)


def compute_score(
    solution_str: str,
    ground_truth: Any,
    strict_box_verify: bool = False,
    pause_tokens_index: list[int] | None = None,
) -> dict[str, Any]:
    """DAPO's reward dict ``{"score", "acc", "pred"}`` on the last 300 characters."""
    if pause_tokens_index is not None:
        correct, pred = verify(solution_str[-300:], ground_truth, strict_box_verify, pause_tokens_index)
        return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
    return dapo_score(solution_str, ground_truth, strict_box_verify)
