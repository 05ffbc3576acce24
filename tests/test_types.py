import json

import pytest

from rlsdk import RolloutConfig, Sample
from rlsdk.types import reward_value


def test_sample_round_trips_through_json():
    sample = Sample(group_index=1, index=5, prompt=[{"role": "user", "content": "hi"}], tokens=[1, 2, 3],
                    label="5", reward={"score": 1.0, "acc": True}, metadata={"rm_type": "dapo"},
                    status=Sample.Status.TRUNCATED)
    sample.append_response_tokens([7, 8], [-0.5, -0.25])
    restored = Sample.from_dict(json.loads(json.dumps(sample.to_dict())))
    assert restored == sample
    assert restored.status is Sample.Status.TRUNCATED


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown Sample fields"):
        Sample.from_dict({"prompt": "x", "rewrd": 1})


def test_append_response_tokens_keeps_masks_and_log_probs_aligned():
    sample = Sample(tokens=[1, 2])
    sample.append_response_tokens([3, 4], [-0.1, -0.2])
    sample.append_response_tokens([5], trainable=False)
    sample.append_response_tokens([6], [-0.3])
    assert sample.tokens == [1, 2, 3, 4, 5, 6]
    assert sample.response_length == 4
    assert sample.prompt_length == 2
    assert sample.loss_mask == [1, 1, 0, 1]
    assert sample.rollout_log_probs == [-0.1, -0.2, 0.0, -0.3]


def test_append_response_tokens_materializes_a_none_loss_mask():
    sample = Sample(tokens=[1, 2, 3], response_length=1, rollout_log_probs=[-1.0])
    sample.append_response_tokens([4], trainable=False)
    assert sample.loss_mask == [1, 0]


@pytest.mark.parametrize(
    ("tokens", "log_probs", "trainable", "message"),
    [([1, 2], [-0.1], True, "2 tokens but 1 log-probs"), ([1], None, True, "need their log-probs")],
)
def test_append_response_tokens_raises_on_mismatch(tokens, log_probs, trainable, message):
    sample = Sample(tokens=[0])
    with pytest.raises(ValueError, match=message):
        sample.append_response_tokens(tokens, log_probs, trainable)
    assert sample.tokens == [0] and sample.response_length == 0


def test_append_response_tokens_refuses_an_already_misaligned_sample():
    sample = Sample(tokens=[1, 2, 3], response_length=2, loss_mask=[1])
    with pytest.raises(ValueError, match="loss_mask has 1 entries"):
        sample.append_response_tokens([4], [-0.1])


def test_get_reward_value_selects_the_reward_key():
    args = RolloutConfig(reward_key="score")
    assert Sample(reward={"score": -1.0, "acc": False}).get_reward_value(args) == -1.0
    assert Sample(reward=0.5).get_reward_value(args) == 0.5
    assert Sample(reward=None).get_reward_value(args) is None


def test_missing_reward_key_names_the_keys_present():
    with pytest.raises(KeyError, match=r"'accuracy' not in the reward's keys \['acc', 'score'\]"):
        reward_value({"score": 1.0, "acc": True}, "accuracy")
    with pytest.raises(KeyError, match="--reward-key"):
        reward_value({"score": 1.0}, None)
