"""slime's other extension points as plugin kinds, in the rollout step and the run's job: sample hooks, rubrics,
logging backends, data sources and environments.

Generation runs on :class:`rlsdk.testing.FakeEngine` (an engine plugin here): these tests are about what the
step and the job do with the plugins' results, which a real model's text cannot pin down; the real engines run
in test_run_e2e.py and the environment scaffold's end-to-end test in test_environments.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from rlsdk import (
    AllSamplesProcess,
    DataSourceFactory,
    Engine,
    Environment,
    EvalRolloutLog,
    PluginCallError,
    Reward,
    RolloutConfig,
    RolloutLog,
    RolloutSampleFilter,
    Sample,
    SampleHook,
    get_plugin_manager,
)
from rlsdk.data import DataSource
from rlsdk.plugins.rubric import RUBRIC_METADATA, parse_rubric
from rlsdk.rollout.evaluation import eval_rollout
from rlsdk.rollout.rewarding import REWARD_ERROR
from rlsdk.rollout.step import rollout_step
from rlsdk.run.job import run_job
from rlsdk.runtime import Runtime, bind_runtime
from rlsdk.testing import FakeEngine

CALLS: list[tuple] = []


def tag_a(args, sample):
    sample.response += "A"  # edited in place: None keeps the sample


async def tag_b(args, sample, *, rollout_id=None, evaluation=False):
    await asyncio.sleep(0)
    sample.metadata["hooked"] = (rollout_id, evaluation)
    return Sample.from_dict({**sample.to_dict(), "response": sample.response + "B"})


def ends_ab(args, sample, **kwargs):
    return float(sample.response.endswith("AB"))


def contains_x(args, sample, **kwargs):
    return float("x" in sample.response)


def crashes(args, sample, **kwargs):
    raise ValueError("grader down")


def log_step(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
    CALLS.append(("step", rollout_id, len(samples), rollout_extra_metrics["rollout/samples"]))
    return False


def log_eval(rollout_id, args, data, extra_metrics):
    CALLS.append(("eval", rollout_id, sorted(data)))
    return False


class Countdown:
    """A data source without a dataset file: endless additions, with a resumable position."""

    def __init__(self, args):
        self.args, self.next, self.buffer = args, 0, []

    def get_samples(self, num_samples, rollout_id=None):
        groups = []
        for _ in range(num_samples):
            self.next += 1
            groups.append(
                [
                    Sample(
                        prompt=f"{self.next} + 1|",
                        label=str(self.next + 1),
                        group_index=self.next,
                        index=self.next * 10 + i,
                    )
                    for i in range(self.args.n_samples_per_prompt)
                ]
            )
        return groups

    def add_samples(self, groups, rollout_id=None):
        self.buffer.extend(groups)

    def state_dict(self):
        return {"next": self.next}

    def load_state_dict(self, state):
        self.next = state["next"]


def second_out(args, groups):
    for group in groups:
        group[1].remove_sample = True


def record_all(args, all_groups, data_source):
    CALLS.append(("all", [(g[0].group_index, g[0].reward) for g in all_groups], type(data_source).__name__))


PLUGINS = [
    SampleHook(name="tag_a", func=tag_a),
    SampleHook(name="tag_b", func=tag_b),
    SampleHook(name="raises", func=lambda args, sample: 1 / 0),
    SampleHook(name="wrong_type", func=lambda args, sample: "not a sample"),
    RolloutSampleFilter(name="second_out", func=second_out),
    RolloutSampleFilter(name="drops_a_sample", func=lambda args, groups: groups[0].pop()),
    AllSamplesProcess(name="record", func=record_all),
    Reward(name="ends_ab", func=ends_ab),
    Reward(name="contains_x", func=contains_x),
    Reward(name="crashes", func=crashes),
    RolloutLog(name="recorder", func=log_step),
    EvalRolloutLog(name="recorder", func=log_eval),
    DataSourceFactory(name="countdown", func=Countdown),
    Engine(name="fake", func=lambda args: FakeEngine(lambda payload, call: "x is the answer")),
    Environment(name="bad_option", func=lambda: {"no_such_option": 1}),
]


COUNTDOWN = dict(engine="fake", data_source_path="countdown", rm_type="contains_x", rollout_batch_size=1)


def countdown_run(out: Path, **options) -> RolloutConfig:
    """A run into ``out`` of the fake engine on the countdown source, graded by contains_x: a prompt of two
    samples a step unless ``options`` say otherwise."""
    return RolloutConfig(**{**COUNTDOWN, "n_samples_per_prompt": 2, "output_dir": str(out), **options})


@pytest.fixture
def pm(plugin_of):
    CALLS.clear()
    return get_plugin_manager(load_entrypoints=False, plugins=[plugin_of(*PLUGINS)])


@pytest.fixture
def step_run(tmp_path, pm):
    """(args, source, runtime) for a rollout step over three prompts whose responses are "x is the answer"."""
    runtimes = []

    def make(**options):
        path = tmp_path / "data.jsonl"
        path.write_text("".join(json.dumps({"input": f"{i}|", "label": "x"}) + "\n" for i in range(3)))
        args = RolloutConfig(
            prompt_data=str(path), label_key="label", n_samples_per_prompt=2, rollout_batch_size=2, **options
        )
        engine = FakeEngine(lambda payload, call: "x is the answer")
        runtime = bind_runtime(args, Runtime(pm, engine, engine.tokenizer))
        runtimes.append(runtime)
        return args, DataSource(args, pm=pm, tokenizer=engine.tokenizer), runtime

    yield make
    for runtime in runtimes:
        runtime.loop.close()


# ----- sample hooks ------------------------------------------------------------------------------------------


def test_sample_hooks_run_in_order_sync_and_async_before_the_reward(step_run):
    args, source, runtime = step_run(rollout_sample_hook_path=["tag_a", "tag_b"], rm_type="ends_ab")
    out = runtime.run(rollout_step(args, 7, source, runtime))
    samples = [s for g in out.samples for s in g]
    assert len(samples) == 4 and all(s.response == "x is the answerAB" for s in samples)
    assert all(s.reward == 1.0 and s.metadata["hooked"] == (7, False) for s in samples)


def test_sample_hooks_in_the_other_order_give_another_response(step_run):
    args, source, runtime = step_run(rollout_sample_hook_path=["tag_b", "tag_a"], rm_type="ends_ab")
    out = runtime.run(rollout_step(args, 0, source, runtime))
    assert {s.response for g in out.samples for s in g} == {"x is the answerBA"}
    assert {s.reward for g in out.samples for s in g} == {0.0}


def test_sample_hooks_run_in_eval_with_evaluation_true(step_run, tmp_path):
    args, source, runtime = step_run(
        rollout_sample_hook_path=["tag_a", "tag_b"],
        rm_type="ends_ab",
        eval_prompt_data=["held", args_path(tmp_path)],
    )
    out = runtime.run(eval_rollout(args, runtime))
    assert out.metrics["eval/held/reward_mean"] == 1.0
    assert {s.metadata["hooked"] for s in out.data["held"]["samples"]} == {(None, True)}


def args_path(tmp_path: Path) -> str:
    return str(tmp_path / "data.jsonl")


@pytest.mark.parametrize(
    ("hook", "error"), [("raises", "ZeroDivisionError"), ("wrong_type", "expected Sample")]
)
def test_a_failing_sample_hook_fails_its_group_naming_the_hook_and_sample(step_run, hook, error):
    args, source, runtime = step_run(
        rollout_sample_hook_path=["tag_a", hook], rm_type="ends_ab", on_failed_step="continue"
    )
    with pytest.warns(RuntimeWarning):
        out = runtime.run(rollout_step(args, 0, source, runtime))
    assert out.samples == [] and out.metrics["ledger/failed"] == out.metrics["ledger/entered"] > 0
    cause = out.metrics["rollout/failures"][0]
    assert f"sample_hook {hook!r}" in cause and error in cause and "on sample 0/" in cause


# ----- rubrics -------------------------------------------------------------------------------------------------


def test_parse_rubric_tells_a_rubric_from_a_name_or_a_dotted_path():
    assert [(p.spec, p.weight) for p in parse_rubric("a:0.7, b:0.3")] == [("a", 0.7), ("b", 0.3)]
    assert [(p.spec, p.weight) for p in parse_rubric("pkg.mod:fn:2")] == [("pkg.mod:fn", 2.0)]
    assert parse_rubric("pkg.mod:fn") is None and parse_rubric("math") is None
    with pytest.raises(ValueError, match="twice"):
        parse_rubric("a:1,a:2")
    with pytest.raises(ValueError, match="finite"):
        parse_rubric("a:1e999")
    assert parse_rubric("a:inf") is None and parse_rubric("pkg.mod:nan") is None  # functions of those names


def test_a_rubric_weighs_its_parts_and_logs_each_as_a_metric(step_run):
    args, source, runtime = step_run(rm_type="contains_x:0.75,ends_ab:0.25")
    out = runtime.run(rollout_step(args, 0, source, runtime))
    samples = [s for g in out.samples for s in g]
    assert {s.reward for s in samples} == {0.75}
    assert samples[0].metadata[RUBRIC_METADATA] == {"contains_x": 1.0, "ends_ab": 0.0}
    assert out.metrics["rollout/rubric/contains_x"] == 1.0 and out.metrics["rollout/rubric/ends_ab"] == 0.0


@pytest.mark.parametrize(
    ("options", "pass_at_1", "threshold"),
    [
        ({}, 0.0, 1.0),  # the full reward, 0.75, short of the rubric's maximum 1.0: no pass
        ({"eval_pass_key": "contains_x"}, 1.0, 1.0),  # the part at its maximum
        ({"eval_pass_key": "ends_ab"}, 0.0, 1.0),
        ({"eval_pass_threshold": 0.7}, 1.0, 0.7),
    ],
)
def test_pass_at_k_of_a_rubric_counts_what_the_user_names(step_run, tmp_path, options, pass_at_1, threshold):
    """Any reward above 0 used to pass: a rubric's 0.75 (one part right) counted as a pass."""
    args, _, runtime = step_run(
        rm_type="contains_x:0.75,ends_ab:0.25", eval_prompt_data=["held", args_path(tmp_path)], **options
    )
    out = runtime.run(eval_rollout(args, runtime))
    assert out.metrics["eval/held/reward_mean"] == 0.75 and out.metrics["eval/held/rubric/contains_x"] == 1.0
    assert out.metrics["eval/held/pass@1"] == pass_at_1 and out.metrics["eval/held/pass_threshold"] == threshold


def test_a_pass_key_no_sample_has_is_an_error_naming_the_parts(step_run, tmp_path):
    args, _, runtime = step_run(
        rm_type="contains_x:0.75,ends_ab:0.25", eval_prompt_data=["held", args_path(tmp_path)], eval_pass_key="x"
    )
    with pytest.raises(ValueError, match=r"eval_pass_key 'x'.*'held'.*contains_x, ends_ab"):
        runtime.run(eval_rollout(args, runtime))


def test_a_failing_rubric_part_makes_the_sample_invalid_never_zero(step_run):
    args, source, runtime = step_run(rm_type="contains_x:0.5,crashes:0.5", on_invalid_reward="drop_group")
    with pytest.warns(RuntimeWarning):
        out = runtime.run(rollout_step(args, 0, source, runtime))
    assert out.samples == [] and out.metrics["rollout/invalid_rewards"] > 0
    dropped = [s for g in out.discarded for s in g]
    assert all(s.reward is None for s in dropped)
    assert (
        "reward 'crashes'" in dropped[0].metadata[REWARD_ERROR]
        and "grader down" in dropped[0].metadata[REWARD_ERROR]
    )


def test_an_unknown_rubric_part_is_an_error_before_anything_runs(pm):
    from rlsdk.plugins.run_plugins import RunPlugins

    with pytest.raises(Exception, match="unknown reward 'nope'"):
        RunPlugins(RolloutConfig(rm_type="contains_x:0.5,nope:0.5"), pm).reward  # noqa: B018


# ----- the job: logging backends and data sources ------------------------------------------------------------------


def test_logging_backends_by_name_several_at_once_with_slimes_arguments(pm, tmp_path):
    eval_data = tmp_path / "eval.jsonl"
    eval_data.write_text(json.dumps({"input": "1|", "label": "x"}) + "\n")
    args = countdown_run(
        tmp_path / "out",
        num_rollout=2,
        eval_interval=1,
        eval_datasets=[{"name": "held", "path": str(eval_data)}],
        custom_rollout_log_function_path="recorder,jsonl",
        custom_eval_rollout_log_function_path="jsonl,recorder",
    )
    run_job(args, pm)
    assert CALLS == [("step", 0, 2, 2), ("eval", 0, ["held"]), ("step", 1, 2, 2), ("eval", 1, ["held"])]
    rows = [json.loads(line) for line in (tmp_path / "out/logs/rollout_log.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [0, 1] and rows[0]["metrics"]["rollout/reward_mean"] == 1.0
    evals = (tmp_path / "out/logs/eval_rollout_log.jsonl").read_text().splitlines()
    assert [json.loads(e)["rewards"] for e in evals] == [{"held": [1.0]}] * 2


def test_an_unknown_logging_backend_fails_before_the_engine_starts(pm, tmp_path):
    args = countdown_run(tmp_path / "out", custom_rollout_log_function_path="jsonl,nope")
    with pytest.raises(
        Exception, match="unknown rollout_log 'nope'. Choose one of: jsonl, recorder, tensorboard"
    ):
        run_job(args, pm)


def test_a_data_source_plugin_serves_a_run_without_prompt_data_and_resumes(pm, tmp_path):
    out = tmp_path / "out"
    run_job(countdown_run(out, num_rollout=2), pm)
    prompts = [json.loads(line)["prompt"] for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert prompts == ["1 + 1|", "1 + 1|", "2 + 1|", "2 + 1|"]
    run_job(countdown_run(out, num_rollout=3, resume=True), pm)
    prompts = [json.loads(line)["prompt"] for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert prompts[4:] == ["3 + 1|", "3 + 1|"]


# ----- environments ------------------------------------------------------------------------------------------------


def test_the_quick_start_is_the_arithmetic_environment_unchanged():
    from rlsdk.run.arithmetic import DEMO_TRAINING, EVAL_DATA, TRAIN_DATA

    plain = RolloutConfig().with_default_data()
    assert (plain.env, plain.prompt_data, plain.label_key, plain.apply_chat_template) == (
        "arithmetic",
        TRAIN_DATA,
        "label",
        True,
    )
    assert plain.num_rollout == 3 and plain.eval_datasets == []  # run without --train: slime's defaults
    trained = RolloutConfig(train=True, lr=0.5).with_default_data(given={"train", "lr"})
    assert trained.num_rollout == DEMO_TRAINING["num_rollout"] and trained.lr == 0.5
    assert trained.eval_datasets == [{"name": "arithmetic-eval", "path": EVAL_DATA}]
    assert RolloutConfig(prompt_data="mine.jsonl").with_default_data().env is None


def test_options_given_win_over_the_environments(pm):
    args = RolloutConfig.from_dict(
        {"env": "arithmetic", "label_key": "answer", "num_rollout": 2, "train": True}
    )
    assert args.label_key == "answer" and args.num_rollout == 2 and args.apply_chat_template
    assert args.rollout_batch_size == 8  # the environment's training setting where none was given


def test_an_environment_is_checked_like_the_command_line(pm):
    with pytest.raises(Exception, match="unknown environment 'nope'. Choose one of: arithmetic, bad_option"):
        RolloutConfig.from_dict({"env": "nope"}, pm=pm)
    with pytest.raises(
        ValueError, match=r"environment 'bad_option' .* sets unknown options \['no_such_option'\]"
    ):
        RolloutConfig.from_dict({"env": "bad_option"}, pm=pm)


def test_a_hook_that_raises_is_wrapped_by_its_call_point(pm):
    from rlsdk.plugins.calls import call_sample_hooks, run_to_completion

    hook = pm.resolve("sample_hook", "raises")
    sample = Sample(group_index=3, index=4, response="r", status=Sample.Status.COMPLETED)
    out = run_to_completion(
        call_sample_hooks([hook], RolloutConfig(), sample, rollout_id=0, evaluation=False)
    )
    assert out.status is Sample.Status.FAILED and "on sample 3/4" in out.metadata["generate_error"]
    with pytest.raises(PluginCallError, match="sample_hook 'raises'"):
        raise PluginCallError(out.metadata["generate_error"])


# ----- sample filter and all-samples processing ----------------------------------------------------------------


def test_a_sample_filter_marks_kept_samples_out_of_the_loss(step_run):
    args, source, runtime = step_run(rollout_sample_filter_path="second_out", rm_type="contains_x")
    out = runtime.run(rollout_step(args, 0, source, runtime))
    assert [[s.remove_sample for s in g] for g in out.samples] == [[False, True], [False, True]]
    assert out.metrics["rollout/removed_samples"] == 2
    from rlsdk.trainer_api import TrainSample

    masks = [TrainSample.from_sample(s, 1.0).loss_mask.tolist() for s in out.samples[0]]
    assert masks[0] == [1] * out.samples[0][0].response_length and set(masks[1]) == {0}


def test_a_sample_filter_that_removes_a_sample_is_named(step_run):
    args, source, runtime = step_run(rollout_sample_filter_path="drops_a_sample", rm_type="contains_x")
    with pytest.raises(PluginCallError, match="rollout_sample_filter 'drops_a_sample' .* changed the groups"):
        runtime.run(rollout_step(args, 0, source, runtime))


def test_all_samples_process_sees_kept_and_dropped_groups_in_order(step_run):
    CALLS.clear()
    args, source, runtime = step_run(
        rollout_all_samples_process_path="record",
        rm_type="contains_x:1,crashes:1",
        on_invalid_reward="drop_group",
        rollout_max_groups_per_step=2,
    )
    with pytest.warns(RuntimeWarning):
        runtime.run(rollout_step(args, 0, source, runtime))
    assert CALLS == [("all", [(0, None), (1, None)], "DataSource")]


def test_megatron_hooks_with_the_torch_trainer_are_refused_before_the_engine_starts(pm, plugin_of, tmp_path):
    """The torch trainer would never call them: the run stops while it resolves its plugins, naming them."""
    from rlsdk import MegatronInit

    pm.register(plugin_of(MegatronInit(name="note", func=lambda args: None)))
    args = countdown_run(tmp_path / "out", train=True, custom_megatron_init_path="note")
    with pytest.raises(
        ValueError, match="--custom-megatron-init-path: megatron hooks, which only --trainer megatron"
    ):
        run_job(args, pm)
