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


def test_from_dict_keeps_unknown_keys_as_attributes_as_slime_does():
    sample = Sample.from_dict({"prompt": "x", "status": "completed", "step": 3, "rollout_id": 2})
    assert sample.step == 3 and sample.rollout_id == 2 and sample.status is Sample.Status.COMPLETED
    assert Sample.from_dict(sample.to_dict()).step == 3


# slime's Sample fields at commit 624b824 of THUDM/slime (slime/utils/types.py)
SLIME_SAMPLE_FIELDS = (
    "group_index", "index", "rollout_id", "prompt", "tokens", "multimodal_inputs", "multimodal_train_inputs",
    "multimodal_train_input_id", "apply_chat_template_kwargs", "response", "response_length", "label",
    "reward", "loss_mask", "weight_versions", "rollout_log_probs", "rollout_top_p_token_ids",
    "rollout_top_p_token_offsets", "rollout_routed_experts", "remove_sample", "teacher_log_probs", "status",
    "metadata", "generate_function_path", "custom_rm_path", "train_metadata", "session_id",
    "non_generation_time", "spec_info", "prefix_cache_info",
)


def test_sample_has_every_field_and_status_of_slimes():
    import dataclasses
    import enum

    assert set(SLIME_SAMPLE_FIELDS) <= {f.name for f in dataclasses.fields(Sample)}
    assert [s.value for s in Sample.Status] == ["pending", "completed", "truncated", "aborted", "failed"]
    slime_status = enum.Enum("Status", {"COMPLETED": "completed"})  # another enum with slime's values
    assert Sample.Status(slime_status.COMPLETED) is Sample.Status.COMPLETED
    sample = Sample(tokens=[1, 2, 3], response_length=2, loss_mask=[1, 0])
    assert sample.effective_response_length == 1
    sample.spec_info.add({"spec_accept_token_num": 3, "spec_draft_token_num": 4})
    sample.prefix_cache_info.add({"cached_tokens": 2, "prompt_tokens": 8})
    assert sample.spec_info.spec_accept_rate == 0.75 and sample.prefix_cache_info.prefix_cache_hit_rate == 0.25
    assert Sample.from_dict(sample.to_dict()) == sample


def test_append_response_tokens_in_slimes_form():
    """slime's generators call ``append_response_tokens(args, tokens=..., ...)`` with text and meta_info."""
    sample = Sample(tokens=[1], response="q")
    sample.append_response_tokens(None, tokens=[2, 3], log_probs=[-0.1, -0.2], text=" ab")
    sample.append_response_tokens(None, tokens=[4], trainable=False, text="!",
                                  meta_info={"finish_reason": {"type": "length"}, "weight_version": "7",
                                             "cached_tokens": 1, "prompt_tokens": 1})
    assert sample.response == "q ab!" and sample.loss_mask == [1, 1, 0]
    assert sample.rollout_log_probs == [-0.1, -0.2, 0.0] and sample.response_length == 3
    assert sample.status is Sample.Status.TRUNCATED and sample.weight_versions == ["7"]
    assert sample.prefix_cache_info.cached_tokens == 1


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
