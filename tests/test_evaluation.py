import pytest

from rlsdk import RolloutConfig
from rlsdk.data.eval_sets import run_eval_datasets
from rlsdk.rollout.evaluation import pass_at_k, pass_ks


def test_pass_at_k_is_the_unbiased_estimate():
    assert pass_at_k([[True, False, False, False]], 1) == pytest.approx(0.25)
    assert pass_at_k([[True, False, False, False]], 4) == 1.0
    assert pass_at_k([[False, False], [True, True]], 1) == 0.5
    assert pass_at_k([[True, False, False, False]], 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)


def test_pass_at_k_is_reported_for_the_powers_of_two_up_to_the_sample_count():
    assert pass_ks(16) == [1, 2, 4, 8, 16] and pass_ks(6) == [1, 2, 4, 6] and pass_ks(1) == [1]


def test_eval_datasets_merge_slime_pairs_and_overrides():
    args = RolloutConfig(eval_prompt_data=["aime", "a.jsonl", "gsm", "g.jsonl"],
                         eval_datasets=[{"name": "math", "path": "m.jsonl", "rm_type": "deepscaler"}])
    assert [d.name for d in run_eval_datasets(args)] == ["math", "aime", "gsm"]


@pytest.mark.parametrize(
    ("values", "message"),
    [({"eval_prompt_data": ["only-a-name"]}, "name/path pairs"),
     ({"eval_datasets": [{"path": "x.jsonl"}]}, "needs a name"),
     ({"eval_datasets": [{"name": "x"}]}, "needs a path"),
     ({"eval_datasets": [{"name": "x", "path": "x.jsonl", "temprature": 0}]}, "unknown key.*did you mean 'temperature'")],
)
def test_bad_eval_datasets_are_clear_errors(values, message):
    with pytest.raises(ValueError, match=message):
        run_eval_datasets(RolloutConfig(**values))
