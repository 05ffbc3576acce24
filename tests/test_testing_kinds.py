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
from rlsdk import testing as kit
from rlsdk.testing import FakeEngine


def exact(args, sample, **kwargs):
    return float(sample.response.strip() == str(sample.label).strip())


def ones(args, rollout_data):
    rollout_data["advantages"] = [torch.ones(n) for n in rollout_data["response_lengths"]]


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


def keep(*, args, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths):
    return pg_loss, loss_masks, {"w": torch.ones_like(pg_loss)}


def keep_one_row(
    *, args, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths
):
    return pg_loss[:1], loss_masks, {}


def add(args, a: int, b: int = 0) -> str:
    """Add two numbers.

    :param a: the first number
    :param b: the second number
    """
    return str(a + b)


def broken_add(args, a: int, b: int = 0) -> str:
    raise RuntimeError("calculator broke")


GOOD = [
    RolloutSampleFilter(name="mark", func=lambda args, groups: setattr(groups[0][0], "remove_sample", True)),
    AllSamplesProcess(name="count", func=lambda args, all_groups, data_source: len(all_groups)),
    SampleHook(name="strip", func=lambda args, sample: sample.response.strip() and None),
    Advantage(name="ones", func=ones),
    RewardPostProcess(name="raw", func=lambda args, samples: ([s.reward for s in samples],) * 2),
    RolloutDataPostprocess(name="noop", func=lambda args, rollout_id, rollout_data: None),
    ConvertSamplesToTrainData(name="plain", func=plain),
    RolloutLog(name="quiet", func=lambda rollout_id, args, samples, metrics, seconds: False),
    EvalRolloutLog(name="quiet", func=lambda rollout_id, args, data, metrics: None),
    CheckpointCallback(name="touch", func=lambda args, rollout_id, path: (path / "seen").write_text("1")),
    DataSourceFactory(
        name="shipped",
        func=lambda args: DataSource(
            args.replace(
                prompt_data=package_file("rlsdk", "datasets/arithmetic-eval.jsonl"), label_key="label"
            ),
            keep_messages=True,
        ),
    ),
    PgLossReducer(
        name="total", func=lambda total_lengths, response_lengths, loss_masks, per_token: torch.sum
    ),
    TisFunction(name="keep", func=keep),
    Reward(name="exact", func=exact),
    Environment(
        name="sums",
        func=lambda: {
            "prompt_data": package_file("rlsdk", "datasets/arithmetic-eval.jsonl"),
            "label_key": "label",
            "rm_type": "exact:1",
        },
    ),
    Engine(name="fake", func=lambda args: FakeEngine(["5"])),
    GenerateRollout(name="step", func=generate_rollout),
    Tool(name="add", func=add),
    MegatronInit(name="seed", func=lambda args: torch.manual_seed(args.rollout_seed) and None),
    MegatronBeforeLogProb(
        name="eval_mode", func=lambda args, model, store_prefix: [m.eval() for m in model] and None
    ),
    MegatronBeforeTrainStep(
        name="zero", func=lambda args, rollout_id, step_id, model, optimizer, scheduler: optimizer.zero_grad()
    ),
    ModelProvider(name="linear", func=lambda pre_process, post_process: torch.nn.Linear(2, 2)),
    UpdateWeightPostWrite(
        name="mark", func=lambda args, version_dir, engines: (Path(version_dir) / "published").touch()
    ),
]
"""A plugin of each kind that its check passes."""

BAD = [
    RolloutSampleFilter(name="mark", func=lambda args, groups: groups.pop()),
    AllSamplesProcess(name="count", func=lambda args, all_groups, data_source: all_groups[1][0].reward + 1),
    SampleHook(name="strip", func=lambda args, sample: 42),
    Advantage(name="ones", func=lambda args, rollout_data: rollout_data.update(advantages=[1])),
    RewardPostProcess(
        name="raw", func=lambda args, samples: ([0.0] * len(samples), [float("nan")] * len(samples))
    ),
    RolloutDataPostprocess(
        name="noop", func=lambda args, rollout_id, rollout_data: rollout_data["rewards"].pop()
    ),
    ConvertSamplesToTrainData(name="plain", func=lambda args, samples: {"tokens": []}),
    RolloutLog(name="quiet", func=lambda rollout_id, args, samples, metrics, seconds: "logged"),
    EvalRolloutLog(name="quiet", func=lambda rollout_id, args, data, metrics: 1 / 0),
    CheckpointCallback(name="touch", func=lambda args, rollout_id, path: open("/nonexistent/x")),  # noqa: SIM115
    DataSourceFactory(name="shipped", func=lambda args: []),
    PgLossReducer(
        name="total", func=lambda total_lengths, response_lengths, loss_masks, per_token: lambda x: x
    ),
    TisFunction(name="keep", func=keep_one_row),
    Environment(name="sums", func=lambda: ["prompt_data"]),
    Engine(name="fake", func=lambda args: "not an engine"),
    Tool(name="add", func=broken_add),
    MegatronInit(name="seed", func=lambda args: 42),
    MegatronBeforeLogProb(name="eval_mode", func=lambda args, model, store_prefix: model[1]),
    MegatronBeforeTrainStep(
        name="zero", func=lambda args, rollout_id, step_id, model, optimizer, scheduler: optimizer
    ),
    ModelProvider(name="linear", func=lambda pre_process, post_process: {"weight": 1}),
    UpdateWeightPostWrite(name="mark", func=lambda args, version_dir, engines: open("/nonexistent/x")),  # noqa: SIM115
]
"""The same names, each with the fault its check names."""


@pytest.fixture
def good(plugin_of):
    return get_plugin_manager(load_entrypoints=False, plugins=[plugin_of(*GOOD)])


@pytest.fixture
def bad(plugin_of):
    return get_plugin_manager(load_entrypoints=False, plugins=[plugin_of(*BAD)])


CHECKS = [
    (kit.check_rollout_sample_filter, "mark", "changed the groups"),
    (kit.check_all_samples_process, "count", "TypeError"),
    (kit.check_sample_hook, "strip", "expected Sample or None"),
    (kit.check_advantage, "ones", r"set rollout_data\['advantages'\] to list"),
    (kit.check_reward_post_process, "raw", "non-finite"),
    (kit.check_rollout_data_postprocess, "noop", "changed the length of rollout_data"),
    (kit.check_convert_samples_to_train_data, "plain", "without"),
    (kit.check_rollout_log, "quiet", "expected a bool"),
    (kit.check_eval_rollout_log, "quiet", "ZeroDivisionError"),
    (kit.check_checkpoint_callback, "touch", "FileNotFoundError"),
    (kit.check_data_source, "shipped", "has no get_samples, add_samples"),
    (kit.check_pg_loss_reducer, "total", "expected a scalar tensor"),
    (kit.check_tis_function, "keep", "pg_loss of shape"),
    (kit.check_engine, "fake", "expected an rlsdk.engine_api.InferenceEngine"),
    (kit.check_megatron_init, "seed", "returned int: a hook makes its changes in place"),
    (kit.check_megatron_before_log_prob, "eval_mode", "before the policy log-probs raised IndexError"),
    (kit.check_megatron_before_train_step, "zero", "before optimizer step 0 of rollout 0 returned AdamW"),
    (kit.check_model_provider, "linear", "built dict, which has no parameters"),
    (
        kit.check_update_weight_post_write,
        "mark",
        "after the weights were written to .* raised FileNotFoundError",
    ),
]


@pytest.mark.parametrize(("check", "name", "fault"), CHECKS, ids=[c[0].__name__ for c in CHECKS])
def test_each_check_passes_a_good_plugin_and_names_a_bad_ones_fault(check, name, fault, good, bad):
    check(good, name)
    with pytest.raises((PluginCallError, AssertionError), match=fault):
        check(bad, name)


def test_check_environment_resolves_its_parts(good, bad):
    args = kit.check_environment(good, "sums")
    assert args.rm_type == "exact:1" and args.label_key == "label"
    with pytest.raises(PluginCallError, match="environment 'sums' .* expected a dict of run options"):
        kit.check_environment(bad, "sums")


def test_check_generate_rollout_runs_one_step_on_a_fake_engine(good, tmp_path):
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
    output = kit.check_generate_rollout(
        good, "step", engine, args, DataSource(args, pm=good, tokenizer=engine.tokenizer)
    )
    assert len(output.samples) == 2 and {s.reward for g in output.samples for s in g} == {1.0}


def test_check_tool_calls_it_with_its_schema(good, bad):
    assert kit.check_tool(good, "add", {"a": 2, "b": 3}).text == "5"
    with pytest.raises(AssertionError, match=r"lack the required \['a'\]"):
        kit.check_tool(good, "add", {"b": 3})
    with pytest.raises(AssertionError, match="calculator broke"):
        kit.check_tool(bad, "add", {"a": 1})


def test_check_reward_takes_a_rubric(good):
    from rlsdk.testing import make_group

    samples = make_group([None, None], label="The answer is 1")
    assert kit.check_reward(good, "exact:0.5", samples=samples) == [0.0, 0.5]


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
def test_check_agent_runs_it_through_openai_agent_on_a_served_engine(small_tokenizer, plugin_of):
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

    agents = plugin_of(Agent(name="asks", func=asks), Agent(name="crashes", func=crashes))
    pm = get_plugin_manager(load_entrypoints=False, plugins=[agents])
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
    items = kit.check_task_generator(pm, "answers", body)
    assert sorted((i["instance_id"], i["uid"]) for i in items) == [
        ("0", "0-0"),
        ("0", "0-1"),
        ("1", "1-0"),
        ("1", "1-1"),
    ]
    with pytest.raises(
        AssertionError, match="task_generator 'broken' .* raised ConnectionError: the environment"
    ):
        kit.check_task_generator(pm, "broken", body)
    with pytest.raises(AssertionError, match="task_generator 'idle' .* wrote no complete group of 2"):
        kit.check_task_generator(pm, "idle", body)
    with pytest.raises(
        AssertionError, match="task_generator 'picky' .*'s group hooks raised KeyError: 'score'"
    ):
        kit.check_task_generator(pm, "picky", body)
