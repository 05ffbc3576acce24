import pytest

from rlsdk import RolloutConfig


def test_defaults_follow_slime_names():
    args = RolloutConfig()
    assert args.rollout_batch_size == args.over_sampling_batch_size
    assert args.input_key == "input" and args.metadata_key == "metadata" and args.tool_key == "tools"
    assert args.buffer_filter_path == "pop_first"
    assert args.rollout_seed == 42


def test_from_yaml_file_with_overrides_and_extra_options(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("rollout-batch-size: 8\nn_samples_per_prompt: 2\nretriever_url: http://127.0.0.1:9\n")
    args = RolloutConfig.from_file(path, rm_type="f1")
    assert args.rollout_batch_size == 8 and args.over_sampling_batch_size == 8
    assert args.n_samples_per_prompt == 2
    assert args.rm_type == "f1"
    assert args.retriever_url == "http://127.0.0.1:9"


def test_from_toml_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('rm_type = "deepscaler"\nrollout_stop = ["</answer>"]\n')
    args = RolloutConfig.from_file(path)
    assert args.rm_type == "deepscaler" and args.rollout_stop == ["</answer>"]


def test_strict_from_dict_suggests_the_option_meant():
    with pytest.raises(ValueError, match="did you mean 'rollout_batch_size'"):
        RolloutConfig.from_dict({"rollout_batch_sise": 3}, strict=True)


def test_unknown_attribute_is_a_clear_error():
    with pytest.raises(AttributeError, match="no option 'nope'"):
        RolloutConfig().nope  # noqa: B018


@pytest.mark.parametrize("values", [{"rollout_batch_size": 0}, {"on_invalid_reward": "ignore"}])
def test_invalid_values_are_rejected(values):
    with pytest.raises(ValueError):
        RolloutConfig(**values)
