"""slime's plugin contracts (``tests/plugin_contracts``), written here for rlsdk's plugins handed to slime by name
(``rlsdk.slime.<kind>.<name>``): the data-source slot built from slime's bare ``args`` (no ``prompt_data``), the
rollout and eval functions called as slime calls them under slime's eval configuration (``EvalDatasetConfig``
objects in ``args.eval_datasets``), and every newer slot's signature and result as slime's call sites use them.

slime itself cannot be installed here (it needs ray, sglang and megatron): its ``args`` is an
``argparse.Namespace`` and its ``EvalDatasetConfig`` a dataclass with slime's field names, written here.
Generation runs on :class:`rlsdk.testing.FakeEngine`.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from rlsdk import (
    Advantage,
    ConvertSamplesToTrainData,
    PgLossReducer,
    Reward,
    RewardPostProcess,
    RolloutDataPostprocess,
    RolloutFnEvalOutput,
    RolloutFnTrainOutput,
    Sample,
    SampleHook,
    TisFunction,
    get_plugin_manager,
    hookimpl,
)
from rlsdk.plugins.loading import load_callable
from rlsdk.runtime import Runtime, bind_runtime
from rlsdk.slime import adapters
from rlsdk.testing import FakeEngine


@dataclass
class EvalDatasetConfig:
    """slime's eval dataset configuration, by its field names (slime/utils/eval_config.py)."""

    name: str
    path: str
    rm_type: str | None = None
    custom_rm_path: str | None = None
    input_key: str | None = None
    label_key: str | None = None
    tool_key: str | None = None
    metadata_key: str | None = None
    multimodal_keys: dict[str, str] | None = None
    apply_chat_template: bool | None = None
    apply_chat_template_kwargs: dict[str, Any] | None = None
    n_samples_per_eval_prompt: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_response_len: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    min_new_tokens: int | None = None
    repetition_penalty: float | None = None
    skip_special_tokens: bool | None = None
    no_stop_trim: bool | None = None
    custom_generate_function_path: str | None = None
    app_service: str | None = None
    eval_task_timeout: int | None = None
    min_eval_samples: int | None = None
    eval_early_stop_remaining: int | None = None
    eval_early_stop_idle_timeout: float | None = None
    message_processor: dict[str, Any] | None = None
    reward_model: dict[str, Any] | None = None
    remote_environment: dict[str, Any] | None = None
    metadata_overrides: dict[str, Any] = field(default_factory=dict)


def make_args(**overrides: Any) -> Any:
    """slime's contract ``args``: a bare object with a few of slime's arguments, no ``prompt_data``."""

    class Args:
        rollout_global_dataset = False
        buffer_filter_path = None
        n_samples_per_prompt = 2
        custom_rm_path = None
        group_rm = False
        rm_type = None
        reward_key = None

    args = Args()
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def exact(args, sample, **kwargs):
    return float(sample.response == sample.label)


class SlimePlugins:
    @hookimpl
    def rlsdk_rewards(self):
        yield Reward(name="exact", func=exact)

    @hookimpl
    def rlsdk_sample_hooks(self):
        def shout(args, sample, *, rollout_id=None, evaluation=False):
            sample.response = sample.response.upper()

        yield SampleHook(name="shout", func=shout)

    @hookimpl
    def rlsdk_reward_post_processes(self):
        yield RewardPostProcess(
            name="plus_one",
            func=lambda args, samples: ([s.reward for s in samples], [s.reward + 1.0 for s in samples]),
        )

    @hookimpl
    def rlsdk_train_data_converters(self):
        def plain(args, samples):
            return {
                "tokens": [s.tokens for s in samples],
                "response_lengths": [s.response_length for s in samples],
                "rewards": [s.reward for s in samples],
                "raw_reward": [s.reward for s in samples],
                "truncated": [0 for _ in samples],
                "sample_indices": [s.index for s in samples],
                "loss_masks": [s.loss_mask for s in samples],
            }

        yield ConvertSamplesToTrainData(name="plain", func=plain)

    @hookimpl
    def rlsdk_rollout_data_postprocesses(self):
        yield RolloutDataPostprocess(name="noop", func=lambda args, rollout_id, rollout_data: None)

    @hookimpl
    def rlsdk_advantages(self):
        def ones(args, rollout_data):
            rollout_data["advantages"] = [torch.ones(n) for n in rollout_data["response_lengths"]]

        yield Advantage(name="ones", func=ones)

    @hookimpl
    def rlsdk_pg_loss_reducers(self):
        yield PgLossReducer(
            name="total", func=lambda total_lengths, response_lengths, loss_masks, per_token: torch.sum
        )

    @hookimpl
    def rlsdk_tis_functions(self):
        def keep(
            *, args, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths
        ):
            return pg_loss, loss_masks, {}

        yield TisFunction(name="keep", func=keep)


@pytest.fixture
def slime_pm(monkeypatch):
    """The plugins ``rlsdk.slime.<kind>`` serves: core's and these (the installed ones, in a slime process)."""
    pm = get_plugin_manager(load_entrypoints=False, plugins=[SlimePlugins()])
    monkeypatch.setattr(adapters, "plugin_manager", lambda: pm)
    return pm


def prompts(tmp_path, n=3):
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps({"question": f"{i}|", "answer": "yes"}) + "\n" for i in range(n)))
    return str(path)


# ----- the data-source slot --------------------------------------------------------------------------------------


def test_data_source_slot_takes_slimes_bare_args_without_prompt_data(slime_pm):
    cls = load_callable("rlsdk.slime.data_source.prompt_data")
    assert tuple(inspect.signature(cls.__init__).parameters)[:2] == ("self", "args")
    groups = cls(make_args()).get_samples(1)
    assert isinstance(groups, list) and len(groups) == 1 and len(groups[0]) == 2  # slime's empty samples
    assert [s.index for s in groups[0]] == [0, 1] and all(s.prompt == "" for s in groups[0])


def test_data_source_slot_serves_prompt_data_buffer_first_and_saves_its_state(slime_pm, tmp_path):
    cls = load_callable("rlsdk.slime.data_source.prompt_data")
    args = make_args(
        prompt_data=prompts(tmp_path), input_key="question", label_key="answer", save=str(tmp_path)
    )
    source = cls(args)
    first = source.get_samples(2)
    assert [g[0].prompt for g in first] == ["0|", "1|"] and first[0][0].label == "yes" and len(source) == 3
    source.add_samples(first[:1])
    assert [g[0].prompt for g in source.get_samples(2)] == ["0|", "2|"]  # the buffer first (pop_first)
    source.save(5)
    again = cls(args)
    again.load(5)
    assert [g[0].prompt for g in again.get_samples(1)] == ["0|"]  # next epoch, where the saved one was


# ----- the rollout and eval functions under slime's eval configuration ---------------------------------------


@pytest.fixture
def slime_run(slime_pm, tmp_path):
    """slime's ``args`` (a Namespace) bound to a FakeEngine that answers "yes" (""YES"" wherever asked to shout)."""
    loops = []

    def make(**values):
        args = argparse.Namespace(**{
            "rm_type": "exact", "n_samples_per_prompt": 2, "rollout_batch_size": 2, "over_sampling_batch_size": 2,
            "input_key": "question", "label_key": "answer", "eval_prompt_data": None, **values,
        })
        engine = FakeEngine(lambda payload, call: "yes")
        runtime = bind_runtime(adapters.view(args), Runtime(slime_pm, engine, engine.tokenizer))
        loops.append(runtime)
        return args, engine

    yield make
    for runtime in loops:
        runtime.loop.close()


def test_eval_function_runs_slimes_eval_dataset_configs(slime_run, tmp_path):
    config = EvalDatasetConfig(
        name="held", path=prompts(tmp_path), n_samples_per_eval_prompt=2, temperature=0.25, max_response_len=7
    )
    args, engine = slime_run(eval_datasets=[config])
    fn = load_callable("rlsdk.slime.generate_rollout.sglang")
    assert tuple(inspect.signature(fn).parameters) == ("args", "rollout_id", "data_source", "evaluation")
    assert inspect.signature(fn).parameters["evaluation"].default is False
    output = fn(args, 5, None, evaluation=True)
    assert isinstance(output, RolloutFnEvalOutput) and set(output.data) == {"held"}
    held = output.data["held"]
    assert len(held["rewards"]) == len(held["truncated"]) == len(held["samples"]) == 6
    assert held["rewards"] == [1.0] * 6 and all(s.reward == 1.0 for s in held["samples"])
    params = engine.payloads[0]["sampling_params"]
    assert params["temperature"] == 0.25 and params["max_new_tokens"] == 7
    assert args.rm_type == "exact" and not hasattr(args, "eval_temperature")  # the run's args are untouched


def test_every_eval_dataset_config_field_slime_uses_reaches_the_samples(slime_run, tmp_path):
    config = EvalDatasetConfig(
        name="held", path=prompts(tmp_path, n=1), stop=["</a>"], stop_token_ids=[7], min_new_tokens=2,
        repetition_penalty=1.1, skip_special_tokens=True, no_stop_trim=False, top_k=5,
        metadata_overrides={"source": "held"}, custom_rm_path="tests.test_slime_contracts:exact",
    )
    args, engine = slime_run(eval_datasets=[config], rm_type="no_such_reward")
    output = load_callable("rlsdk.slime.generate_rollout.sglang")(args, 0, None, evaluation=True)
    assert output.data["held"]["rewards"] == [1.0]  # the dataset's custom_rm_path, over the run's rm_type
    assert output.data["held"]["samples"][0].metadata["source"] == "held"
    params = engine.payloads[0]["sampling_params"]
    assert {k: params[k] for k in ("stop", "stop_token_ids", "min_new_tokens", "repetition_penalty", "top_k")} == {
        "stop": ["</a>"], "stop_token_ids": [7], "min_new_tokens": 2, "repetition_penalty": 1.1, "top_k": 5}
    assert params["skip_special_tokens"] is True and params["no_stop_trim"] is False


def test_an_eval_dataset_config_field_slime_never_uses_is_accepted_with_a_warning(slime_run, tmp_path):
    config = EvalDatasetConfig(name="held", path=prompts(tmp_path), app_service="http://localhost:18080")
    args, _ = slime_run(eval_datasets=[config])
    fn = load_callable("rlsdk.slime.generate_rollout.sglang")
    with pytest.warns(UserWarning, match=r"eval dataset 'held': \['app_service'\] are ignored: slime parses"):
        output = fn(args, 0, None, evaluation=True)
    assert output.data["held"]["rewards"] == [1.0] * 3


def test_rollout_function_with_slimes_data_source_returns_full_groups(slime_run):
    class ContractDataSource:  # slime's contract data source: get_samples(num_samples) only
        def __init__(self):
            self.next = 0

        def get_samples(self, num_samples):
            groups = []
            for _ in range(num_samples):
                groups.append(
                    [
                        Sample(
                            group_index=self.next,
                            index=2 * self.next + i,
                            prompt=f"{self.next}|",
                            label="yes",
                        )
                        for i in range(2)
                    ]
                )
                self.next += 1
            return groups

        def add_samples(self, groups):
            raise AssertionError("nothing goes back: every group finishes")

    args, _ = slime_run(eval_datasets=[])
    fn = load_callable("rlsdk.slime.generate_rollout.sglang")
    output = fn(args, 2, ContractDataSource(), evaluation=False)
    assert isinstance(output, RolloutFnTrainOutput) and len(output.samples) == 2
    for group in output.samples:
        assert len(group) == 2 and all(s.reward == 1.0 and s.status is Sample.Status.COMPLETED for s in group)
        assert all(isinstance(t, int) for s in group for t in s.tokens) and group[0].response == "yes"


# ----- the newer slots, as slime's call sites call them ---------------------------------------------------------


def test_runtime_hook_slots_have_slimes_signatures_and_results(slime_pm, tmp_path):
    samples = [
        Sample(
            index=i,
            reward=0.5 + i,
            tokens=[i, i + 1],
            response_length=2,
            loss_mask=[1, 1],
            status=Sample.Status.COMPLETED,
        )
        for i in range(2)
    ]
    log = load_callable("rlsdk.slime.rollout_log.jsonl")
    assert tuple(inspect.signature(log).parameters) == (
        "rollout_id",
        "args",
        "samples",
        "rollout_extra_metrics",
        "rollout_time",
    )
    logged = make_args(output_dir=str(tmp_path))
    assert log(3, logged, samples, {"reward": 1.0}, 0.5) is False
    assert json.loads((tmp_path / "logs/rollout_log.jsonl").read_text())["rollout_id"] == 3
    assert logged.logged_rollout_id == 3  # slime's contract: the rollout logged, noted on args
    eval_log = load_callable("rlsdk.slime.eval_rollout_log.jsonl")
    assert tuple(inspect.signature(eval_log).parameters) == ("rollout_id", "args", "data", "extra_metrics")
    data = {"eval_set": {"rewards": [1.0], "truncated": [False], "samples": samples[:1]}}
    assert eval_log(4, logged, data, {"acc": 1.0}) is False and logged.logged_eval_rollout_id == 4

    post = load_callable("rlsdk.slime.reward_post_process.plus_one")
    assert tuple(inspect.signature(post).parameters) == ("args", "samples")
    assert post(make_args(), samples) == ([0.5, 1.5], [1.5, 2.5])
    convert = load_callable("rlsdk.slime.convert_samples_to_train_data.plain")
    assert tuple(inspect.signature(convert).parameters) == ("args", "samples")
    assert {
        "tokens",
        "response_lengths",
        "rewards",
        "raw_reward",
        "truncated",
        "sample_indices",
        "loss_masks",
    } <= set(convert(make_args(), samples))
    postprocess = load_callable("rlsdk.slime.rollout_data_postprocess.noop")
    assert tuple(inspect.signature(postprocess).parameters) == ("args", "rollout_id", "rollout_data")
    assert postprocess(make_args(), 0, {}) is None


def test_sample_hook_and_trainer_slots_in_slimes_calling_convention(slime_pm):
    hook = load_callable("rlsdk.slime.sample_hook.shout")
    params = inspect.signature(hook).parameters
    assert (
        tuple(params)[:2] == ("args", "sample")
        and params["rollout_id"].kind is inspect.Parameter.KEYWORD_ONLY
    )
    out = asyncio.run(hook(make_args(), Sample(index=0, response="yes"), rollout_id=1, evaluation=False))
    assert out.response == "YES"

    advantage = load_callable("rlsdk.slime.advantage.ones")
    rollout_data: dict[str, Any] = {"rewards": [1.0, 0.0], "response_lengths": [2, 3]}
    assert advantage(make_args(), rollout_data) is None and [len(a) for a in rollout_data["advantages"]] == [
        2,
        3,
    ]
    reducer = load_callable("rlsdk.slime.pg_loss_reducer.total")(
        [4, 5], [2, 3], [torch.ones(2), torch.ones(3)], False
    )
    assert float(reducer(torch.ones(5))) == 5.0
    tis = load_callable("rlsdk.slime.tis_function.keep")
    loss = torch.ones(3)
    result = tis(
        args=make_args(),
        pg_loss=loss,
        train_log_probs=[torch.zeros(3)],
        rollout_log_probs=[torch.zeros(3)],
        loss_masks=[torch.ones(3)],
        total_lengths=[5],
        response_lengths=[3],
    )
    assert result[0] is loss and len(result[1]) == 1 and result[2] == {}


def test_sample_filter_and_all_samples_slots_as_slime_calls_them(slime_pm):
    from rlsdk import AllSamplesProcess, RolloutSampleFilter

    class More:
        @hookimpl
        def rlsdk_rollout_sample_filters(self):
            def last_out(args, groups):
                for group in groups:
                    group[-1].remove_sample = True

            yield RolloutSampleFilter(name="last_out", func=last_out)

        @hookimpl
        def rlsdk_all_samples_processes(self):
            def count(args, all_groups, data_source):
                args.processed_group_count = len(all_groups)

            yield AllSamplesProcess(name="count", func=count)

    slime_pm.register(More())
    sample_filter = load_callable("rlsdk.slime.rollout_sample_filter.last_out")
    assert tuple(inspect.signature(sample_filter).parameters)[:2] == ("args", "groups")
    groups = [[Sample(index=0), Sample(index=1)], [Sample(index=2), Sample(index=3)]]
    sample_filter(object(), groups)
    assert [[s.remove_sample for s in g] for g in groups] == [
        [False, True],
        [False, True],
    ]  # slime's own samples
    process = load_callable("rlsdk.slime.all_samples_process.count")
    assert tuple(inspect.signature(process).parameters)[:3] == ("args", "all_groups", "data_source")
    args = make_args()
    process(args, [[Sample(index=0)]], object())
    assert args.processed_group_count == 1


def test_megatron_and_weight_sync_slots_as_slime_calls_them(slime_pm, tmp_path):
    """slime's megatron backend calls ``init(args)``, ``hook(args, model, store_prefix)``, ``hook(args,
    rollout_id, step_id, model, optimizer, opt_param_scheduler)``, ``provider(pre_process=, post_process=,
    vp_stage=)`` (``vp_stage`` only where the signature has it) and, after a disk sync's write,
    ``hook(args, version_dir, rollout_engines)``; each plugin gets slime's ``args`` with rlsdk's defaults."""
    from rlsdk import (
        MegatronBeforeLogProb,
        MegatronBeforeTrainStep,
        MegatronInit,
        ModelProvider,
        UpdateWeightPostWrite,
    )

    seen: list[tuple[Any, ...]] = []

    class Megatron:
        @hookimpl
        def rlsdk_megatron_inits(self):
            yield MegatronInit(name="note", func=lambda args: seen.append(("init", args.lr)) and None)

        @hookimpl
        def rlsdk_megatron_before_log_probs(self):
            yield MegatronBeforeLogProb(
                name="note", func=lambda args, model, prefix: seen.append(("log_prob", prefix)) and None
            )

        @hookimpl
        def rlsdk_megatron_before_train_steps(self):
            def note(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
                seen.append(("train_step", rollout_id, step_id, opt_param_scheduler))

            yield MegatronBeforeTrainStep(name="note", func=note)

        @hookimpl
        def rlsdk_model_providers(self):
            def linear(pre_process, post_process, vp_stage=None):
                seen.append(("provider", pre_process, post_process, vp_stage))
                return torch.nn.Linear(2, 2)

            yield ModelProvider(name="linear", func=linear)

        @hookimpl
        def rlsdk_update_weight_post_writes(self):
            def publish(args, version_dir, rollout_engines):
                seen.append(("post_write", version_dir, rollout_engines))

            yield UpdateWeightPostWrite(name="note", func=publish)

    slime_pm.register(Megatron())
    args = make_args()
    init = load_callable("rlsdk.slime.megatron_init.note")
    assert tuple(inspect.signature(init).parameters) == ("args",) and init(args) is None
    before_log_prob = load_callable("rlsdk.slime.megatron_before_log_prob.note")
    assert tuple(inspect.signature(before_log_prob).parameters) == ("args", "model", "store_prefix")
    before_log_prob(args, [torch.nn.Linear(2, 2)], "ref_")
    before_train_step = load_callable("rlsdk.slime.megatron_before_train_step.note")
    assert tuple(inspect.signature(before_train_step).parameters) == (
        "args",
        "rollout_id",
        "step_id",
        "model",
        "optimizer",
        "opt_param_scheduler",
    )
    before_train_step(args, 2, 1, [], None, "scheduler")
    provider = load_callable("rlsdk.slime.model_provider.linear")
    assert "vp_stage" in inspect.signature(provider).parameters
    assert isinstance(provider(pre_process=True, post_process=False, vp_stage=0), torch.nn.Linear)
    post_write = load_callable("rlsdk.slime.update_weight_post_write.note")
    assert tuple(inspect.signature(post_write).parameters) == ("args", "version_dir", "rollout_engines")
    post_write(args, str(tmp_path), ("engine-actor",))
    assert seen == [
        ("init", 1e-6),  # rlsdk's default lr: slime's args here has none
        ("log_prob", "ref_"),
        ("train_step", 2, 1, "scheduler"),
        ("provider", True, False, 0),
        ("post_write", str(tmp_path), ["engine-actor"]),
    ]
