"""rlsdk.testing's checks for every kind beyond the rollout filters: each passes a good plugin and names the
fault of a bad one, through the kind's call point (the error is the one the run would raise); and tool
schemas built from type hints and docstrings."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Literal

import pytest
import torch

from rlsdk import (
    Advantage,
    AllSamplesProcess,
    CheckpointCallback,
    ConvertSamplesToTrainData,
    DataSourceFactory,
    Engine,
    Environment,
    EvalRolloutLog,
    GenerateRollout,
    MegatronBeforeLogProb,
    MegatronBeforeTrainStep,
    MegatronInit,
    ModelProvider,
    PgLossReducer,
    PluginCallError,
    PluginError,
    Reward,
    RewardPostProcess,
    RolloutConfig,
    RolloutDataPostprocess,
    RolloutLog,
    RolloutSampleFilter,
    SampleHook,
    TaskGenerator,
    TisFunction,
    Tool,
    UpdateWeightPostWrite,
    get_plugin_manager,
    hookimpl,
    package_file,
)
from rlsdk.data import DataSource
from rlsdk.rollout.step import generate_rollout
from rlsdk.testing import (
    FakeEngine,
    check_advantage,
    check_all_samples_process,
    check_checkpoint_callback,
    check_convert_samples_to_train_data,
    check_data_source,
    check_engine,
    check_environment,
    check_eval_rollout_log,
    check_generate_rollout,
    check_megatron_before_log_prob,
    check_megatron_before_train_step,
    check_megatron_init,
    check_model_provider,
    check_pg_loss_reducer,
    check_reward,
    check_reward_post_process,
    check_rollout_data_postprocess,
    check_rollout_log,
    check_rollout_sample_filter,
    check_sample_hook,
    check_task_generator,
    check_tis_function,
    check_tool,
    check_update_weight_post_write,
)


def exact(args, sample, **kwargs):
    return float(sample.response.strip() == str(sample.label).strip())


class Good:
    @hookimpl
    def rlsdk_rollout_sample_filters(self):
        yield RolloutSampleFilter(
            name="mark", func=lambda args, groups: setattr(groups[0][0], "remove_sample", True)
        )

    @hookimpl
    def rlsdk_all_samples_processes(self):
        yield AllSamplesProcess(name="count", func=lambda args, all_groups, data_source: len(all_groups))

    @hookimpl
    def rlsdk_sample_hooks(self):
        yield SampleHook(name="strip", func=lambda args, sample: sample.response.strip() and None)

    @hookimpl
    def rlsdk_advantages(self):
        def ones(args, rollout_data):
            rollout_data["advantages"] = [torch.ones(n) for n in rollout_data["response_lengths"]]

        yield Advantage(name="ones", func=ones)

    @hookimpl
    def rlsdk_reward_post_processes(self):
        yield RewardPostProcess(name="raw", func=lambda args, samples: ([s.reward for s in samples],) * 2)

    @hookimpl
    def rlsdk_rollout_data_postprocesses(self):
        yield RolloutDataPostprocess(name="noop", func=lambda args, rollout_id, rollout_data: None)

    @hookimpl
    def rlsdk_train_data_converters(self):
        def plain(args, samples):
            return {
                key: [getattr(s, attr, 0) for s in samples]
                for key, attr in (
                    ("tokens", "tokens"),
                    ("response_lengths", "response_length"),
                    ("rewards", "reward"),
                    ("raw_reward", "reward"),
                    ("truncated", "-"),
                    ("sample_indices", "index"),
                    ("loss_masks", "loss_mask"),
                )
            }

        yield ConvertSamplesToTrainData(name="plain", func=plain)

    @hookimpl
    def rlsdk_rollout_logs(self):
        yield RolloutLog(name="quiet", func=lambda rollout_id, args, samples, metrics, seconds: False)

    @hookimpl
    def rlsdk_eval_rollout_logs(self):
        yield EvalRolloutLog(name="quiet", func=lambda rollout_id, args, data, metrics: None)

    @hookimpl
    def rlsdk_checkpoint_callbacks(self):
        yield CheckpointCallback(
            name="touch", func=lambda args, rollout_id, path: (path / "seen").write_text("1")
        )

    @hookimpl
    def rlsdk_data_sources(self):
        yield DataSourceFactory(
            name="shipped",
            func=lambda args: DataSource(
                args.replace(
                    prompt_data=package_file("rlsdk", "datasets/arithmetic-eval.jsonl"), label_key="label"
                ),
                keep_messages=True,
            ),
        )

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
            return pg_loss, loss_masks, {"w": torch.ones_like(pg_loss)}

        yield TisFunction(name="keep", func=keep)

    @hookimpl
    def rlsdk_rewards(self):
        yield Reward(name="exact", func=exact)

    @hookimpl
    def rlsdk_environments(self):
        yield Environment(
            name="sums",
            func=lambda: {
                "prompt_data": package_file("rlsdk", "datasets/arithmetic-eval.jsonl"),
                "label_key": "label",
                "rm_type": "exact:1",
            },
        )

    @hookimpl
    def rlsdk_engines(self):
        yield Engine(name="fake", func=lambda args: FakeEngine(["5"]))

    @hookimpl
    def rlsdk_generate_rollouts(self):
        yield GenerateRollout(name="step", func=generate_rollout)

    @hookimpl
    def rlsdk_tools(self):
        def add(args, a: int, b: int = 0) -> str:
            """Add two numbers.

            :param a: the first number
            :param b: the second number
            """
            return str(a + b)

        yield Tool(name="add", func=add)

    @hookimpl
    def rlsdk_megatron_inits(self):
        yield MegatronInit(name="seed", func=lambda args: torch.manual_seed(args.rollout_seed) and None)

    @hookimpl
    def rlsdk_megatron_before_log_probs(self):
        yield MegatronBeforeLogProb(
            name="eval_mode", func=lambda args, model, store_prefix: [m.eval() for m in model] and None
        )

    @hookimpl
    def rlsdk_megatron_before_train_steps(self):
        yield MegatronBeforeTrainStep(
            name="zero",
            func=lambda args, rollout_id, step_id, model, optimizer, scheduler: optimizer.zero_grad(),
        )

    @hookimpl
    def rlsdk_model_providers(self):
        yield ModelProvider(name="linear", func=lambda pre_process, post_process: torch.nn.Linear(2, 2))

    @hookimpl
    def rlsdk_update_weight_post_writes(self):
        yield UpdateWeightPostWrite(
            name="mark", func=lambda args, version_dir, engines: (Path(version_dir) / "published").touch()
        )


class Bad:
    @hookimpl
    def rlsdk_rollout_sample_filters(self):
        yield RolloutSampleFilter(name="mark", func=lambda args, groups: groups.pop())

    @hookimpl
    def rlsdk_all_samples_processes(self):
        yield AllSamplesProcess(
            name="count", func=lambda args, all_groups, data_source: all_groups[1][0].reward + 1
        )

    @hookimpl
    def rlsdk_sample_hooks(self):
        yield SampleHook(name="strip", func=lambda args, sample: 42)

    @hookimpl
    def rlsdk_advantages(self):
        yield Advantage(name="ones", func=lambda args, rollout_data: rollout_data.update(advantages=[1]))

    @hookimpl
    def rlsdk_reward_post_processes(self):
        yield RewardPostProcess(
            name="raw", func=lambda args, samples: ([0.0] * len(samples), [float("nan")] * len(samples))
        )

    @hookimpl
    def rlsdk_rollout_data_postprocesses(self):
        yield RolloutDataPostprocess(
            name="noop", func=lambda args, rollout_id, rollout_data: rollout_data["rewards"].pop()
        )

    @hookimpl
    def rlsdk_train_data_converters(self):
        yield ConvertSamplesToTrainData(name="plain", func=lambda args, samples: {"tokens": []})

    @hookimpl
    def rlsdk_rollout_logs(self):
        yield RolloutLog(name="quiet", func=lambda rollout_id, args, samples, metrics, seconds: "logged")

    @hookimpl
    def rlsdk_eval_rollout_logs(self):
        yield EvalRolloutLog(name="quiet", func=lambda rollout_id, args, data, metrics: 1 / 0)

    @hookimpl
    def rlsdk_checkpoint_callbacks(self):
        yield CheckpointCallback(name="touch", func=lambda args, rollout_id, path: open("/nonexistent/x"))  # noqa: SIM115

    @hookimpl
    def rlsdk_data_sources(self):
        yield DataSourceFactory(name="shipped", func=lambda args: [])

    @hookimpl
    def rlsdk_pg_loss_reducers(self):
        yield PgLossReducer(
            name="total", func=lambda total_lengths, response_lengths, loss_masks, per_token: lambda x: x
        )

    @hookimpl
    def rlsdk_tis_functions(self):
        def keep(
            *, args, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths
        ):
            return pg_loss[:1], loss_masks, {}

        yield TisFunction(name="keep", func=keep)

    @hookimpl
    def rlsdk_environments(self):
        yield Environment(name="sums", func=lambda: ["prompt_data"])

    @hookimpl
    def rlsdk_engines(self):
        yield Engine(name="fake", func=lambda args: "not an engine")

    @hookimpl
    def rlsdk_tools(self):
        def add(args, a: int, b: int = 0) -> str:
            raise RuntimeError("calculator broke")

        yield Tool(name="add", func=add)

    @hookimpl
    def rlsdk_megatron_inits(self):
        yield MegatronInit(name="seed", func=lambda args: 42)

    @hookimpl
    def rlsdk_megatron_before_log_probs(self):
        yield MegatronBeforeLogProb(name="eval_mode", func=lambda args, model, store_prefix: model[1])

    @hookimpl
    def rlsdk_megatron_before_train_steps(self):
        yield MegatronBeforeTrainStep(
            name="zero", func=lambda args, rollout_id, step_id, model, optimizer, scheduler: optimizer
        )

    @hookimpl
    def rlsdk_model_providers(self):
        yield ModelProvider(name="linear", func=lambda pre_process, post_process: {"weight": 1})

    @hookimpl
    def rlsdk_update_weight_post_writes(self):
        yield UpdateWeightPostWrite(
            name="mark", func=lambda args, version_dir, engines: open("/nonexistent/x")
        )  # noqa: SIM115


CHECKS = [
    (check_rollout_sample_filter, "mark", "changed the groups"),
    (check_all_samples_process, "count", "TypeError"),
    (check_sample_hook, "strip", "expected Sample or None"),
    (check_advantage, "ones", r"set rollout_data\['advantages'\] to list"),
    (check_reward_post_process, "raw", "non-finite"),
    (check_rollout_data_postprocess, "noop", "changed the length of rollout_data"),
    (check_convert_samples_to_train_data, "plain", "without"),
    (check_rollout_log, "quiet", "expected a bool"),
    (check_eval_rollout_log, "quiet", "ZeroDivisionError"),
    (check_checkpoint_callback, "touch", "FileNotFoundError"),
    (check_data_source, "shipped", "has no get_samples, add_samples"),
    (check_pg_loss_reducer, "total", "expected a scalar tensor"),
    (check_tis_function, "keep", "pg_loss of shape"),
    (check_engine, "fake", "expected an rlsdk.engine_api.InferenceEngine"),
    (check_megatron_init, "seed", "returned int: a hook makes its changes in place"),
    (check_megatron_before_log_prob, "eval_mode", "before the policy log-probs raised IndexError"),
    (check_megatron_before_train_step, "zero", "before optimizer step 0 of rollout 0 returned AdamW"),
    (check_model_provider, "linear", "built dict, which has no parameters"),
    (check_update_weight_post_write, "mark", "after the weights were written to .* raised FileNotFoundError"),
]


@pytest.mark.parametrize(("check", "name", "fault"), CHECKS, ids=[c[0].__name__ for c in CHECKS])
def test_each_check_passes_a_good_plugin_and_names_a_bad_ones_fault(check, name, fault):
    good = get_plugin_manager(load_entrypoints=False, plugins=[Good()])
    check(good, name)
    bad = get_plugin_manager(load_entrypoints=False, plugins=[Bad()])
    with pytest.raises((PluginCallError, AssertionError), match=fault):
        check(bad, name)


def test_check_environment_resolves_its_parts():
    good = get_plugin_manager(load_entrypoints=False, plugins=[Good()])
    args = check_environment(good, "sums")
    assert args.rm_type == "exact:1" and args.label_key == "label"
    bad = get_plugin_manager(load_entrypoints=False, plugins=[Bad()])
    with pytest.raises(PluginCallError, match="environment 'sums' .* expected a dict of run options"):
        check_environment(bad, "sums")


def test_check_generate_rollout_runs_one_step_on_a_fake_engine(tmp_path):
    pm = get_plugin_manager(load_entrypoints=False, plugins=[Good()])
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"input": f"{i}", "label": "5"}) + "\n" for i in range(4)))
    args = RolloutConfig(
        prompt_data=str(data),
        label_key="label",
        rm_type="exact",
        rollout_batch_size=2,
        n_samples_per_prompt=2,
    )
    engine = FakeEngine(lambda payload, call: "5")
    output = check_generate_rollout(
        pm, "step", engine, args, DataSource(args, pm=pm, tokenizer=engine.tokenizer)
    )
    assert len(output.samples) == 2 and {s.reward for g in output.samples for s in g} == {1.0}


def test_check_tool_calls_it_with_its_schema():
    good = get_plugin_manager(load_entrypoints=False, plugins=[Good()])
    assert check_tool(good, "add", {"a": 2, "b": 3}).text == "5"
    with pytest.raises(AssertionError, match=r"lack the required \['a'\]"):
        check_tool(good, "add", {"b": 3})
    bad = get_plugin_manager(load_entrypoints=False, plugins=[Bad()])
    with pytest.raises(AssertionError, match="calculator broke"):
        check_tool(bad, "add", {"a": 1})


def test_check_reward_takes_a_rubric():
    good = get_plugin_manager(load_entrypoints=False, plugins=[Good()])
    from rlsdk.testing import make_group

    samples = make_group([None, None], label="The answer is 1")
    assert check_reward(good, "exact:0.5", samples=samples) == [0.0, 0.5]


# ----- tool schemas from type hints ----------------------------------------------------------------------------


class Unit(enum.Enum):
    KM = "km"
    MI = "mi"


def search(
    args,
    query: str,
    top_k: int = 3,
    mode: Literal["fast", "exact"] = "fast",
    tags: list[str] | None = None,
    unit: Unit = Unit.KM,
    weight: float | None = None,
    filters: dict | None = None,
):
    """Search the index.

    Args:
        query: what to look for
        top_k (int): how many passages
    """
    return query


def test_a_tools_schema_comes_from_its_signature_and_docstring():
    schema = Tool(name="search", func=search).schema()
    assert schema == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the index.",
            "parameters": {
                "type": "object",
                "required": ["query"],
                "properties": {
                    "query": {"type": "string", "description": "what to look for"},
                    "top_k": {"type": "integer", "description": "how many passages", "default": 3},
                    "mode": {"type": "string", "enum": ["fast", "exact"], "default": "fast"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "unit": {"type": "string", "enum": ["km", "mi"], "default": "km"},
                    "weight": {"type": "number"},
                    "filters": {"type": "object"},
                },
            },
        },
    }
    assert Tool(name="search", func=search).tag_argument == "query"


def test_a_given_schema_wins_and_kwargs_only_tools_take_a_query():
    given = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    assert Tool(name="s", func=lambda args, **kw: "", parameters=given).parameters == given
    assert Tool(name="s", func=lambda args, **kw: "").parameters["required"] == ["query"]


def test_an_annotation_without_a_json_schema_is_an_error_naming_the_tool():
    def odd(args, when: complex):
        return ""

    with pytest.raises(PluginError, match="tool 'odd': parameter 'when': cannot describe"):
        Tool(name="odd", func=odd)


@pytest.mark.slow
def test_check_agent_runs_it_through_openai_agent_on_a_served_engine(small_tokenizer):
    """A FakeEngine with SmolLM2's tokenizer (its chat template), served on loopback: the agent's replies are
    fixed, so a broken agent is told from a bad model answer."""
    from rlsdk import Agent
    from rlsdk.testing import ServedEngine, check_agent

    async def asks(args, sample, client):
        reply = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": sample.prompt}]
        )
        return reply.choices[0].message.content

    async def crashes(args, sample, client):
        raise RuntimeError("agent bug")

    class Agents:
        @hookimpl
        def rlsdk_agents(self):
            yield Agent(name="asks", func=asks)
            yield Agent(name="crashes", func=crashes)

    pm = get_plugin_manager(load_entrypoints=False, plugins=[Agents()])
    with ServedEngine(FakeEngine(["Hi there."] * 2, small_tokenizer)) as served:
        sample = check_agent(pm, "asks", served)
        assert sample.metadata["agent"]["result"] == "Hi there."
        with pytest.raises(AssertionError, match="agent 'crashes' .* RuntimeError: agent bug"):
            check_agent(pm, "crashes", served)


class Tasks:
    """Task generators for the rollout buffer: one that writes a group per input row, one that fails, one
    that writes nothing, one whose group hook fails."""

    @hookimpl
    def rlsdk_task_generators(self):
        import httpx

        def answers(data):
            rows = [json.loads(line) for line in Path(data["input_file"]).read_text().splitlines()]
            for r, row in enumerate(rows):
                for n in range(int(data["num_repeat_per_sample"])):
                    item = {
                        "instance_id": r,
                        "uid": f"{r}-{n}",
                        "messages": [
                            {"role": "user", "content": row["q"]},
                            {"role": "assistant", "content": row["a"]},
                        ],
                        "reward": 1.0,
                    }
                    httpx.post(data["remote_buffer_url"] + "/buffer/write", json=item).raise_for_status()

        def broken(data):
            raise ConnectionError("the environment server is down")

        yield TaskGenerator(name="answers", func=answers)
        yield TaskGenerator(name="broken", func=broken)
        yield TaskGenerator(name="idle", func=lambda data: None)

        def needs_score(group, group_size, task_type):
            return all(item["extra_info"]["score"] > 0 for item in group[1])

        yield TaskGenerator(name="picky", func=answers, is_valid_group=needs_score)


def test_check_task_generator_runs_it_on_a_served_buffer(tmp_path):
    pm = get_plugin_manager(load_entrypoints=False, plugins=[Tasks()])
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"q": "1+1", "a": "2"}\n{"q": "2+2", "a": "4"}\n')
    body = {"input_file": str(rows), "num_repeat_per_sample": 2}
    items = check_task_generator(pm, "answers", body)
    assert sorted((i["instance_id"], i["uid"]) for i in items) == [
        ("0", "0-0"),
        ("0", "0-1"),
        ("1", "1-0"),
        ("1", "1-1"),
    ]
    with pytest.raises(
        AssertionError, match="task_generator 'broken' .* raised ConnectionError: the environment"
    ):
        check_task_generator(pm, "broken", body)
    with pytest.raises(AssertionError, match="task_generator 'idle' .* wrote no complete group of 2"):
        check_task_generator(pm, "idle", body)
    with pytest.raises(
        AssertionError, match="task_generator 'picky' .*'s group hooks raised KeyError: 'score'"
    ):
        check_task_generator(pm, "picky", body)
