"""The rewards named after slime's give slime's verdicts, quirks included. Each case is a verdict of slime's
reward hub at commit 624b824 (its tests/test_rm_*.py pass against rlsdk_rm_hub.slime_rm_hub; see the
README), run here through rlsdk's reward call point with real grading workers."""

import pytest

from rlsdk import REWARD_ERROR
from rlsdk_rm_hub.f1 import f1_score
from rlsdk_rm_hub.slime_rm_hub import math_dapo_utils, math_utils
from rlsdk_rm_hub.slime_rm_hub.deepscaler import get_deepscaler_rule_based_reward
from rlsdk_rm_hub.slime_rm_hub.gpqa import _extract_letter_from_response, compute_gpqa_reward


@pytest.mark.parametrize(
    "rm,response,label,expected",
    [
        # \text{} answers are compared by their text: no false positive (they once normalized to "")
        ("deepscaler", "</think>\\boxed{\\text{A}}", "\\text{B}", 0.0),
        ("slime_math", "\\boxed{\\text{A}}", "\\text{B}", 0.0),
        ("slime_math", "\\boxed{\\text{A}}", "\\text{A}", 1.0),
        # text answers ignore case (sympy-side normalization lower-cases)
        ("slime_math", "\\boxed{Paris}", "paris", 1.0),
        # unreduced fractions must match literally; integers only match integers (no 2^{10} == 1024)
        ("slime_math", "\\boxed{2/4}", "1/2", 0.0),
        ("slime_math", "\\boxed{2^{10}}", "1024", 0.0),
        ("deepscaler", "</think>\\boxed{42}", 42.0, 1.0),
        # an \fbox is found but never unwrapped, so it never scores
        ("slime_math", "\\fbox{7}", "7", 0.0),
        # the last </think> counts; the first ###Response counts
        ("deepscaler", "</think>\\boxed{1}</think>\\boxed{2}", "2", 1.0),
        ("deepscaler", "###Response\\boxed{1}###Response\\boxed{2}", "1", 1.0),
        # an empty label scores 0 (slime's rule), as does slime_math's falsy label 0
        ("deepscaler", "</think>\\boxed{42}", "", 0.0),
        ("slime_math", "\\boxed{0}", 0, 0.0),
        ("f1", "yes", "yes it is", 0.0),
        ("f1", "", "", 0.0),
        ("f1", "the cat sat", "The cat sat.", 1.0),
        ("slime_math", "so \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("slime_math", "so \\boxed{\\dfrac{1}{2}}", "\\boxed{\\frac12}", 1.0),
        ("slime_math", "so \\boxed{x^2-1}", "(x-1)(x+1)", 1.0),
        ("slime_math", "the answer is 5", "5", 0.0),
        ("slime_math", "\\boxed{10\\%}", "10", 1.0),
        ("deepscaler", "<think>\\boxed{4}</think> So \\boxed{5}", "5", 1.0),
        ("deepscaler", "no marker \\boxed{5}", "5", 0.0),
        ("deepscaler", "</think> \\boxed{6}", "5", 0.0),
    ],
)
def test_verdicts_are_slimes(rm, response, label, expected, graded):
    sample = graded(response, label, rm)
    assert sample.reward == expected, sample.metadata


@pytest.mark.parametrize("rm", ["slime_math", "deepscaler", "dapo", "f1"])
def test_a_missing_label_is_an_error_not_a_verdict(rm, graded):
    sample = graded("</think>\\boxed{4} Answer: 4", None, rm)
    assert sample.reward is None and "--label-key" in sample.metadata[REWARD_ERROR]


def test_dapo_reads_integers_and_strips_end_of_turn_tokens(graded):
    assert graded("...\nAnswer: 42<|im_end|>", "42.0", "dapo").reward == {
        "score": 1.0,
        "acc": True,
        "pred": "42",
    }
    invalid = graded("Answer: 1/2", "\\frac12", "dapo")
    assert invalid.reward is None and "integer labels" in invalid.metadata[REWARD_ERROR]


@pytest.mark.parametrize(
    "response,label,metadata,expected",
    [
        ("Answer: C", 2, {"choices": ["a", "b", "c", "d"]}, 1.0),  # integer label: an index
        ("I think the answer is B.", "capital of france", {"choices": ["London", "Capital of France"]}, 1.0),
        ("Definitely paris.", "Paris", {"choices": ["London", "Paris", "Berlin"]}, 1.0),  # text fallback
        ("Answer: A is wrong.</think>The answer is B.", "B", {}, 1.0),  # only after </think>
        (
            "The answer is (B).",
            "B",
            {},
            0.0,
        ),  # slime's case-insensitive pattern reads the "i" of "is": option I
        ("we ruled out A, then B, settled on C", "C", {}, 1.0),
    ],
)
def test_gpqa_verdicts(response, label, metadata, expected, graded):
    assert graded(response, label, "gpqa", metadata).reward == expected


def test_slime_named_functions_keep_slimes_shapes():
    """The slime-named module functions return slime's types: ints, tuples, dicts, None, errors."""
    assert get_deepscaler_rule_based_reward("\\boxed{42}", "42") == 0  # no marker
    assert get_deepscaler_rule_based_reward("</think>\\boxed{\\frac{1}{2}}", "0.5") == 1
    assert math_utils.grade_answer_verl("\\boxed{x+1}", "1+x") is True
    assert (
        math_utils.last_boxed_only_string("\\fbox{7}") == "\\fbox{7}"
        and math_utils.remove_boxed("\\fbox{7}") is None
    )
    assert (
        math_utils._strip_string("\\frac12") == "\\frac{1}{2}"
        and math_utils._strip_string(".5") == "\\frac{1}{2}"
    )
    assert math_utils.mathd_normalize_answer("\\sqrt") == "\\sqrt"  # normalization chokes: kept as it is
    with pytest.raises(AssertionError, match="box error"):
        math_dapo_utils.remove_boxed("not boxed")
    assert math_dapo_utils.compute_score("\\boxed{42}", "42", strict_box_verify=True) == {
        "score": 1.0,
        "acc": True,
        "pred": "42",
    }
    assert f1_score(None, "x") == (0, 0, 0) and f1_score("yes", "yes") == (1.0, 1.0, 1.0)
    assert _extract_letter_from_response("Answer: C, but actually A was right, no wait B.", ["A", "B"]) == "B"
    assert compute_gpqa_reward(None, "A") == 0.0
