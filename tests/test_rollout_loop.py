"""The rollout step: ledger, over-sampling, filters, aborts, partial rollouts and plugin failures.

Generation runs on :class:`rlsdk.testing.FakeEngine`: the real engines (the embedded transformers engine
and the SGLang client against ``rlsdk serve``) are tested with the real small model in their own tests and
end to end in ``test_run_e2e.py``, but these tests need what a real model cannot give: exact control over
which request is still running when a step ends, so that aborts and partial rollouts happen at known
points. Rewards, filters, the data source and the buffer are the real ones.
"""

from __future__ import annotations

import importlib
import importlib.util

import asyncio
import json

import pytest

from rlsdk import (
    CustomGenerate,
    DynamicFilter,
    DynamicFilterOutput,
    OverSamplingFilter,
    Reward,
    RolloutConfig,
)
from rlsdk.data import DataSource
from rlsdk.rollout.generate import generate
from rlsdk.rollout.step import rollout_step
from rlsdk.runtime import Runtime, bind_runtime
from rlsdk.testing import ByteTokenizer, FakeEngine, FakeReply
from rlsdk.types import Sample

ANSWER = "answer {n} is here"


def response_for(prompt: str) -> str:
    return ANSWER.format(n=prompt.split()[0])


def exact(args, sample, **kwargs):
    return float(sample.response == sample.label)


def crashes_on_odd(args, sample, **kwargs):
    if int(sample.prompt.split()[0]) % 2:
        raise ValueError("grader crashed")
    return exact(args, sample)


def even_only(args, samples, **kwargs):
    keep = int(samples[0].prompt.split()[0]) % 2 == 0
    return DynamicFilterOutput(keep=keep, reason=None if keep else "odd")


def drop_all_fallback(args, samples, **kwargs):
    return DynamicFilterOutput(keep=False, reason="never", keep_when_insufficient=True)


def highest_first(args, groups, **kwargs):
    return sorted(groups, key=lambda g: -int(g[0].prompt.split()[0]))


async def broken(args, sample, sampling_params):
    if sample.prompt.startswith("1 "):
        raise RuntimeError("tool server down")
    return await generate(args, sample, sampling_params)


async def wrong_type(args, sample, sampling_params):
    return {"text": "not a sample"}


async def hangs(args, sample, sampling_params):
    await asyncio.sleep(3600)


async def counts_attempts(args, sample, sampling_params):
    sample.metadata["attempts"] = sample.metadata.get("attempts", 0) + 1
    return await generate(args, sample, sampling_params)


LOOP_PLUGINS = [
    Reward(name="exact", func=exact),
    Reward(name="crashes_on_odd", func=crashes_on_odd),
    DynamicFilter(name="even_only", func=even_only),
    DynamicFilter(name="drop_all", func=lambda args, samples: False),
    DynamicFilter(name="drop_all_fallback", func=drop_all_fallback),
    OverSamplingFilter(name="highest_first", func=highest_first),
    CustomGenerate(name="broken", func=broken),
    CustomGenerate(name="wrong_type", func=wrong_type),
    CustomGenerate(name="hangs", func=hangs),
    CustomGenerate(name="counts_attempts", func=counts_attempts),
]


@pytest.fixture
def make_run(tmp_path, rlsdk_pm, plugin_of):
    """Build (args, data source, runtime, engine) over ``n_prompts`` prompts ``"<i> ...|"``; prompts
    whose number is in ``slow`` stall after 3 tokens for ``slow_seconds`` or until aborted (only on
    their first attempt)."""
    if importlib.util.find_spec("rlsdk_filter_hub") is not None:  # its filters in the tests marked so
        rlsdk_pm.register(importlib.import_module("rlsdk_filter_hub.plugin"))
    rlsdk_pm.register(plugin_of(*LOOP_PLUGINS))
    runtimes = []

    def make(n_prompts=6, slow=(), slow_seconds=10.0, **options):
        path = tmp_path / "data.jsonl"
        rows = [{"input": f"{i} {'slow' if i in slow else 'fast'}|", "label": ANSWER.format(n=i)}
                for i in range(n_prompts)]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        defaults = dict(prompt_data=str(path), label_key="label", rm_type="exact", n_samples_per_prompt=2,
                        rollout_batch_size=2, over_sampling_batch_size=4, rollout_max_response_len=64)
        args = RolloutConfig(**{**defaults, **options})

        def respond(payload, call):
            ids = payload["input_ids"]
            start = ids.index(ord("|")) + 1
            prompt, so_far = bytes(ids[:start]).decode(), ids[start:]
            rest = list(response_for(prompt).encode())[len(so_far):]
            if int(prompt.split()[0]) in slow and not so_far:  # a long-tail request: 3 tokens, then stalls
                return FakeReply(ids=rest, seconds=slow_seconds, partial_tokens=3)
            return FakeReply(ids=rest)

        engine = FakeEngine(respond)
        runtime = bind_runtime(args, Runtime(rlsdk_pm, engine, ByteTokenizer()))
        runtimes.append(runtime)
        source = DataSource(args, pm=rlsdk_pm, tokenizer=runtime.tokenizer)
        return args, source, runtime, engine

    yield make
    for runtime in runtimes:
        runtime.loop.close()


def step(args, source, runtime, rollout_id=0):
    return runtime.run(rollout_step(args, rollout_id, source, runtime))


def prompts_of(groups):
    return [g[0].prompt for g in groups]


def test_step_keeps_the_batch_and_returns_surplus_groups_to_the_buffer(make_run):
    args, source, runtime, _ = make_run()
    out = step(args, source, runtime)
    assert len(out.samples) == 2 and all(len(g) == 2 for g in out.samples)
    assert all(s.reward == 1.0 and s.status is Sample.Status.COMPLETED for g in out.samples for s in g)
    m = out.metrics
    assert m["ledger/entered"] == 8 and m["ledger/kept"] == 4 and m["ledger/returned"] == 4
    assert source.get_buffer_length() == 2
    # the surplus groups (whichever two finished last) are complete: served next step without generating again
    surplus = {f"{i} fast|" for i in range(4)} - set(prompts_of(out.samples))
    before = len(runtime.engine.payloads)
    out2 = step(args, source, runtime, rollout_id=1)
    assert set(prompts_of(out2.samples)) == surplus and len(surplus) == 2
    assert len(runtime.engine.payloads) - before == 4  # only the two fresh groups of the next chunk


def test_a_step_sends_requests_before_it_has_created_every_task_of_a_chunk(make_run):
    """Every SUBMIT_SLICE samples the step lets the tasks it created run, so the engine gets the first
    requests of a 512-sample chunk while the other groups' tasks do not exist yet."""
    args, source, runtime, engine = make_run(n_prompts=64, n_samples_per_prompt=8, rollout_batch_size=64,
                                             over_sampling_batch_size=64)
    tasks_at_first_request = []
    generate = engine.generate

    async def counting(payload):
        if not tasks_at_first_request:
            tasks_at_first_request.append(len(asyncio.all_tasks()))
        return await generate(payload)

    engine.generate = counting
    out = step(args, source, runtime)
    assert out.metrics["ledger/kept"] == 512
    assert tasks_at_first_request[0] < 64  # without the slices: the step, 64 groups and 7 samples' tasks


def test_partial_rollout_resumes_from_tokens_with_the_remaining_budget(make_run):
    args, source, runtime, engine = make_run(slow={2, 3}, partial_rollout=True,
                                             mask_offpolicy_in_partial_rollout=True)
    out = step(args, source, runtime)
    assert prompts_of(out.samples) == ["0 fast|", "1 fast|"]
    assert out.metrics["rollout/aborted"] == 4 and out.metrics["ledger/returned"] == 4
    buffered = [s for g in source.buffer for s in g]
    assert all(s.response_length == 3 and s.status is Sample.Status.ABORTED for s in buffered)

    out = step(args, source, runtime, rollout_id=1)
    assert prompts_of(out.samples) == ["2 slow|", "3 slow|"]
    resumed = [r for r in engine.payloads if len(r["input_ids"]) > len(b"2 slow|")]
    assert len(resumed) == 4
    assert all(r["sampling_params"]["max_new_tokens"] == 64 - 3 for r in resumed)
    for sample in (s for g in out.samples for s in g):
        assert sample.response == response_for(sample.prompt) and sample.reward == 1.0
        assert sample.loss_mask == [0] * 3 + [1] * (sample.response_length - 3)
        assert len(sample.rollout_log_probs) == sample.response_length
        assert sample.tokens == list(sample.prompt.encode()) + list(sample.response.encode())
    assert out.metrics["rollout/resumed"] == 4
    assert out.metrics["ledger/entered"] == out.metrics["ledger/kept"] + out.metrics["ledger/returned"]


def test_without_partial_rollout_aborted_groups_start_over(make_run):
    args, source, runtime, engine = make_run(slow={2, 3}, custom_generate_function_path="counts_attempts")
    step(args, source, runtime)
    buffered = [s for g in source.buffer for s in g]
    assert all(s.response_length == 0 and s.status is Sample.Status.PENDING for s in buffered)
    assert all("attempts" not in s.metadata for s in buffered)  # nothing of the abandoned attempt
    out = step(args, source, runtime, rollout_id=1)
    slow = [r["input_ids"] for r in engine.payloads if bytes(r["input_ids"]).startswith(b"2 slow|")]
    assert slow == [list(b"2 slow|")] * 4  # two samples, twice, each time from the bare prompt
    assert all(s.metadata["attempts"] == 1 for g in out.samples for s in g)
    assert all("attempts" not in s.metadata and s.metadata["returned_at_rollout_id"] == 1
               for g in source.buffer for s in g)


def test_dynamic_filter_drops_with_reason_and_over_sampling_filter_orders(make_run):
    args, source, runtime, _ = make_run(n_prompts=8, dynamic_sampling_filter_path="even_only",
                                        over_sampling_filter_path="highest_first", over_sampling_batch_size=8)
    out = step(args, source, runtime)
    assert out.metrics["rollout/dynamic_filter/drop_odd"] == 8
    kept_numbers = [int(p.split()[0]) for p in prompts_of(out.samples)]
    assert kept_numbers == sorted(kept_numbers, reverse=True) and all(n % 2 == 0 for n in kept_numbers)
    assert all(s.metadata["drop_reason"] == "odd" for g in out.discarded for s in g)


def test_a_filter_that_drops_everything_cannot_loop_forever(make_run):
    args, source, runtime, _ = make_run(dynamic_sampling_filter_path="drop_all", rollout_max_groups_per_step=6)
    with pytest.warns(RuntimeWarning, match=r"step 0: 0 of 2 groups \(12 samples dropped, 0 failed\): it pulled 6 groups, the cap"):
        out = step(args, source, runtime)
    assert out.samples == [] and out.metrics["ledger/dropped"] == 12
    assert out.metrics["rollout/short_of_batch"] == 2


def test_keep_when_insufficient_tops_up_the_batch(make_run):
    args, source, runtime, _ = make_run(dynamic_sampling_filter_path="drop_all_fallback",
                                        rollout_max_groups_per_step=4)
    out = step(args, source, runtime)
    assert len(out.samples) == 2 and out.metrics["rollout/dynamic_filter/drop_never"] == 4


@pytest.mark.parametrize(
    ("generator", "message"),
    [("broken", "custom_generate 'broken' from plugin .* on sample 1/2 raised RuntimeError: tool server down"),
     ("wrong_type", "returned dict, expected Sample or list\\[Sample\\]"),
     ("hangs", "hung: no result after 0.2 s")],
)
def test_plugin_failures_are_recorded_and_accounted(make_run, generator, message):
    args, source, runtime, _ = make_run(n_prompts=4, custom_generate_function_path=generator, generate_timeout=0.2)
    out = step(args, source, runtime)
    m = out.metrics
    assert m["ledger/failed"] >= 2
    assert any(__import__("re").search(message, f) for f in m["rollout/failures"]), m["rollout/failures"]
    assert m["ledger/entered"] == m["ledger/kept"] + m["ledger/failed"] + m["ledger/returned"] + m["ledger/dropped"]
    failed = [s for g in out.discarded for s in g if "generate_error" in s.metadata]
    assert failed and all(s.status is Sample.Status.FAILED for s in failed)


@pytest.mark.parametrize("policy", ["drop_group", "score"])
def test_invalid_rewards_are_counted_and_follow_the_policy(make_run, policy):
    args, source, runtime, _ = make_run(n_prompts=4, rm_type="crashes_on_odd", on_invalid_reward=policy,
                                        invalid_reward_value=-1.0, rollout_batch_size=2, over_sampling_batch_size=4)
    out = step(args, source, runtime)
    m = out.metrics
    if policy == "drop_group":  # both odd groups dropped
        assert m["rollout/invalid_rewards"] == 4 and m["rollout/dynamic_filter/drop_invalid_reward"] == 4
        assert prompts_of(out.samples) == ["0 fast|", "2 fast|"]
    else:  # group 1 kept with the configured value; group 3 is surplus, back in the buffer
        assert m["rollout/invalid_rewards"] == 2 and source.get_buffer_length() == 2
        assert [s.reward for s in out.samples[1]] == [-1.0, -1.0]
        assert "grader crashed" in out.samples[1][0].metadata["reward_error"]


def test_deterministic_mode_seeds_each_sample(make_run):
    args, source, runtime, engine = make_run(sglang_enable_deterministic_inference=True, rollout_seed=7)
    step(args, source, runtime)
    seeds = sorted({r["sampling_params"]["sampling_seed"] for r in engine.payloads})
    assert seeds == [7, 8]


@pytest.mark.parametrize("deterministic", [False, True])
def test_deterministic_mode_batches_groups_in_draw_order(make_run, deterministic):
    """Groups 0 and 1 finish last. The batch is in the order groups finished, except in deterministic mode:
    there it is in draw order, so a real engine's timing cannot reorder the trainer's batch (on one H200 it
    did: two runs' first steps matched and their second trained the same samples in another order)."""
    args, source, runtime, _ = make_run(n_prompts=4, slow={0, 1}, slow_seconds=0.05, rollout_batch_size=4,
                                        sglang_enable_deterministic_inference=deterministic)
    out = step(args, source, runtime)
    drawn = [f"{i} {'slow' if i < 2 else 'fast'}|" for i in range(4)]
    assert prompts_of(out.samples) == (drawn if deterministic else drawn[2:] + drawn[:2])


def test_ledger_balances_over_many_steps_with_partial_rollouts(make_run):
    args, source, runtime, _ = make_run(n_prompts=10, slow={1, 4, 5, 8}, slow_seconds=0.05,
                                        partial_rollout=True, dynamic_sampling_filter_path="even_only")
    seen = []
    for rollout_id in range(6):
        out = step(args, source, runtime, rollout_id)
        m = out.metrics
        assert m["ledger/entered"] == m["ledger/kept"] + m["ledger/dropped"] + m["ledger/returned"] + m["ledger/failed"]
        seen += prompts_of(out.samples)
    assert all(int(p.split()[0]) % 2 == 0 for p in seen)


def test_a_step_whose_every_sample_failed_stops_the_run_with_the_causes(make_run):
    """Never a quiet step of nothing: all samples failed -> an error naming the causes (configurable)."""
    from rlsdk.errors import RlsdkError
    from rlsdk.run.job import check_step

    args, source, runtime, _ = make_run(n_prompts=4, custom_generate_function_path="wrong_type",
                                        rollout_max_groups_per_step=2)
    out = step(args, source, runtime)
    assert out.metrics["ledger/failed"] == out.metrics["ledger/entered"] == 4
    with pytest.raises(RlsdkError, match="step 0: all 4 samples failed .*returned dict"):
        check_step(args, 0, out.metrics)
    check_step(args.replace(on_failed_step="continue"), 0, out.metrics)
    got_through = {**out.metrics, "ledger/entered": 5, "rollout/unusable_groups": 1}
    check_step(args, 0, got_through)  # one sample got through: no error
