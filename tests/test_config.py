import dataclasses
import sys
import types

import pytest

from rlsdk import Option, RolloutConfig, hookimpl
from rlsdk.engines.launch import arguments


def test_defaults_follow_slime_names():
    args = RolloutConfig()
    assert args.rollout_batch_size == args.over_sampling_batch_size
    assert args.input_key == "input" and args.metadata_key == "metadata" and args.tool_key == "tools"
    assert args.buffer_filter_path == "pop_first"
    assert args.rollout_seed == 42


class RetrieverOptions:
    @hookimpl
    def rlsdk_options(self):
        yield Option("retriever_url", str, help="URL of the retrieval server")
        yield Option("retriever_topk", int, 3, help="Passages per search")


@pytest.fixture
def retriever_pm(rlsdk_pm):
    rlsdk_pm.register(RetrieverOptions(), "retriever")
    return rlsdk_pm


def test_from_yaml_file_with_overrides_and_plugin_options(tmp_path, retriever_pm):
    path = tmp_path / "run.yaml"
    path.write_text("rollout-batch-size: 8\nn_samples_per_prompt: 2\nretriever_url: http://127.0.0.1:9\n")
    args = RolloutConfig.from_file(path, pm=retriever_pm, rm_type="f1")
    assert args.rollout_batch_size == 8 and args.over_sampling_batch_size == 8
    assert args.n_samples_per_prompt == 2
    assert args.rm_type == "f1"
    assert args.retriever_url == "http://127.0.0.1:9" and args.retriever_topk == 3  # declared default
    assert args.replace(num_rollout=1).retriever_topk == 3


@pytest.mark.parametrize(
    ("values", "error"),
    [
        (
            {"rollout_batch_sise": 3},
            "unknown option 'rollout_batch_sise' (did you mean 'rollout_batch_size'?)",
        ),
        ({"rm_typ": "math"}, "unknown option 'rm_typ' (did you mean 'rm_type'?)"),
        ({"retriever_url": 3}, "option 'retriever_url' takes a str, got 3"),
        ({"retriever_topk": "3"}, "option 'retriever_topk' takes a int, got '3'"),
        ({"rollout_temprature": 0}, "did you mean 'rollout_temperature'?"),
        ({"rollout_temperature": "hot"}, "option 'rollout_temperature' takes a float, got 'hot'"),
    ],
)
def test_unknown_keys_and_wrong_types_are_errors_with_a_did_you_mean(values, error, retriever_pm, tmp_path):
    with pytest.raises(ValueError) as raised:
        RolloutConfig.from_dict(values, pm=retriever_pm)
    assert error in str(raised.value)
    path = tmp_path / "run.json"
    path.write_text(__import__("json").dumps(values))
    with pytest.raises(ValueError, match=f"{path}: "):
        RolloutConfig.from_file(path, pm=retriever_pm)


def test_short_names_work_in_config_files_too():
    args = RolloutConfig.from_dict({"rm": "f1", "data": "x.jsonl", "temperature": 0})
    assert (args.rm_type, args.prompt_data, args.rollout_temperature) == ("f1", "x.jsonl", 0.0)


def test_slime_arguments_rlsdk_ignores_are_accepted_with_slimes_defaults():
    args = RolloutConfig.from_dict({"sglang_dp_size": 2, "use_distributed_post": True})
    assert args.sglang_dp_size == 2 and args.use_distributed_post is True and args.rollout_num_engines == 1


def test_an_option_several_plugins_read_is_cores():
    """max_turns is read by multi_turn, search_r1 and tool_agent: core declares it, once."""
    assert RolloutConfig().max_turns == 4 and RolloutConfig(max_turns=2).max_turns == 2
    with pytest.raises(ValueError, match="did you mean 'max_turns'"):
        RolloutConfig(max_turn=2)


def test_the_installed_plugins_options_read_their_defaults_and_are_checked():
    """rlsdk-generators declares tool_call_format (skipped where that package is not installed)."""
    pytest.importorskip("rlsdk_generators")
    assert RolloutConfig().tool_call_format == "auto"
    with pytest.raises(ValueError, match="'tool_call_format' must be one of auto, tag, json, got 'xml'"):
        RolloutConfig(tool_call_format="xml")


def test_sglang_and_router_settings_are_checked_where_they_can_be():
    """A typo of one of rlsdk's own sglang_ options is refused with the option; others pass on to the
    launched server with a warning when SGLang is not installed here (this CPU machine)."""
    with pytest.raises(ValueError, match="did you mean 'sglang_server_concurrency'"):
        RolloutConfig.from_dict({"sglang_server_concurency": 8})
    arguments.installed_arguments.cache_clear()
    with pytest.warns(
        UserWarning, match="sglang_foo_bar: passed to the launched sglang as --foo-bar unchecked"
    ):
        assert RolloutConfig.from_dict({"sglang_foo_bar": 1}).sglang_foo_bar == 1


def test_sglang_settings_are_checked_against_the_installed_servers_arguments(monkeypatch):
    """SGLang needs CUDA, so its ServerArgs is faked here: a dataclass under its module's name."""

    @dataclasses.dataclass
    class ServerArgs:
        chunked_prefill_size: int = 8192

    module = types.ModuleType("sglang.srt.server_args")
    module.ServerArgs = ServerArgs  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sglang.srt.server_args", module)
    arguments.installed_arguments.cache_clear()
    try:
        assert RolloutConfig.from_dict({"sglang_chunked_prefill_size": 4}).sglang_chunked_prefill_size == 4
        with pytest.raises(
            ValueError,
            match="ServerArgs has no argument 'chunked_prefil_size' .*'sglang_chunked_prefill_size'",
        ):
            RolloutConfig.from_dict({"sglang_chunked_prefil_size": 4})
    finally:
        arguments.installed_arguments.cache_clear()


def test_from_toml_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('rm_type = "deepscaler"\nrollout_stop = ["</answer>"]\n')
    args = RolloutConfig.from_file(path)
    assert args.rm_type == "deepscaler" and args.rollout_stop == ["</answer>"]


def test_unknown_attribute_is_a_clear_error():
    with pytest.raises(AttributeError, match="no option 'nope'"):
        RolloutConfig().nope  # noqa: B018


@pytest.mark.parametrize("values", [{"rollout_batch_size": 0}, {"on_invalid_reward": "ignore"}])
def test_invalid_values_are_rejected(values):
    with pytest.raises(ValueError):
        RolloutConfig(**values)
