import pytest

from rlsdk import RolloutConfig
from rlsdk.rollout.evaluation import eval_datasets, pass_at_k


def test_pass_at_k_is_the_unbiased_estimate():
    assert pass_at_k([[True, False, False, False]], 1) == pytest.approx(0.25)
    assert pass_at_k([[True, False, False, False]], 4) == 1.0
    assert pass_at_k([[False, False], [True, True]], 1) == 0.5
    assert pass_at_k([[True, False, False, False]], 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)


def test_eval_datasets_merge_slime_pairs_and_overrides():
    args = RolloutConfig(eval_prompt_data=["aime", "a.jsonl", "gsm", "g.jsonl"],
                         eval_datasets=[{"name": "math", "path": "m.jsonl", "rm_type": "deepscaler"}])
    assert [d["name"] for d in eval_datasets(args)] == ["math", "aime", "gsm"]


@pytest.mark.parametrize(
    ("values", "message"),
    [({"eval_prompt_data": ["only-a-name"]}, "name/path pairs"),
     ({"eval_datasets": [{"path": "x.jsonl"}]}, "needs a name and a path"),
     ({"eval_datasets": [{"name": "x", "path": "x.jsonl", "temperature": 0}]}, "unknown options")],
)
def test_bad_eval_datasets_are_clear_errors(values, message):
    with pytest.raises(ValueError, match=message):
        eval_datasets(RolloutConfig(**values))
