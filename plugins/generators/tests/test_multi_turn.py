"""The multi_turn generator against ``rlsdk.testing.FakeEngine``, a stand-in for the embedded
engine that plays back scripted turns in SGLang's response shape with SmolLM2's real tokenizer.
These check token-by-token alignment of tokens, loss masks and log-probs; the end-to-end test with
the real model is ``test_multi_turn_on_embedded_engine``."""

import asyncio
import json

import pytest

from rlsdk import RolloutConfig, Sample, Tool, hookimpl
from rlsdk.testing import sampling_params_for
from rlsdk import Runtime
from rlsdk.testing import bind_runtime
from rlsdk.testing import FakeEngine, FakeReply
from rlsdk_generators import plugin as generators_plugin
from rlsdk_generators.multi_turn import multi_turn

PROMPT = "<|im_start|>user\nWhat is 12*7?<|im_end|>\n<|im_start|>assistant\n"


class FlakyTools:
    @hookimpl
    def rlsdk_tools(self):
        def broken(args, query):
            raise RuntimeError("index offline")

        async def slow(args, query):
            await asyncio.sleep(30)

        yield Tool(name="broken", func=broken)
        yield Tool(name="slow", func=slow, timeout=0.2)


def setup(pm, tokenizer, turns, **options):
    pm.register(generators_plugin)
    pm.register(FlakyTools())
    args = RolloutConfig(**{"tool_names": ["calculator"], **options})
    engine = FakeEngine(turns, tokenizer)
    bind_runtime(args, Runtime(pm, engine, tokenizer))
    prompt_ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    sample = Sample(group_index=0, index=0, prompt=PROMPT, tokens=list(prompt_ids))
    return args, engine, sample, prompt_ids


def run(args, sample):
    return asyncio.run(multi_turn(args, sample, sampling_params_for(args)))


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def check_alignment(sample, prompt_ids, segments):
    """``segments``: (token ids, trainable, engine call number or None) in order after the prompt."""
    expected_tokens, expected_mask, expected_lp = list(prompt_ids), [], []
    for seg_ids, trainable, call in segments:
        expected_tokens += seg_ids
        expected_mask += [int(trainable)] * len(seg_ids)
        expected_lp += [-call - j / 1000 for j in range(len(seg_ids))] if trainable else [0.0] * len(seg_ids)
    assert sample.tokens == expected_tokens
    assert sample.response_length == len(expected_tokens) - len(prompt_ids)
    assert sample.loss_mask == expected_mask
    assert sample.rollout_log_probs == pytest.approx(expected_lp)


def test_tag_style_tool_call_masks_the_observation(rlsdk_pm, small_tokenizer):
    tok = small_tokenizer
    turn1 = "I will compute it. <calculator>12*7</calculator> and then more"
    turn2 = "The answer is 84.<|im_end|>"
    args, engine, sample, prompt_ids = setup(rlsdk_pm, tok, [turn1, turn2])
    sample = run(args, sample)
    said1 = "I will compute it. <calculator>12*7</calculator>"
    observation = "\n<result>\n84\n</result>\n"
    check_alignment(
        sample,
        prompt_ids,
        [(ids(tok, said1), True, 1), (ids(tok, observation), False, None), (ids(tok, turn2), True, 2)],
    )
    assert sample.status == Sample.Status.COMPLETED
    # the end-of-turn token is in the ids (check_alignment above), not in the text, as in SGLang's text
    assert sample.response == said1 + observation + turn2.removesuffix("<|im_end|>")
    assert sample.metadata["multi_turn"]["turns"] == 2 and sample.metadata["multi_turn"]["tool_calls"] == 1
    first, second = engine.payloads
    assert "</calculator>" in first["sampling_params"]["stop"]
    assert second["input_ids"] == prompt_ids + ids(tok, said1) + ids(tok, observation)
    used = len(ids(tok, said1)) + len(ids(tok, observation))
    assert second["sampling_params"]["max_new_tokens"] == args.rollout_max_response_len - used


def test_json_tool_call_through_the_chat_template(rlsdk_pm, small_tokenizer):
    tok = small_tokenizer
    call = json.dumps({"name": "calculator", "arguments": {"expression": "(2+3)*4"}})
    turn1 = f"<tool_call>{call}</tool_call><|im_end|>"
    turn2 = "It is 20.<|im_end|>"
    args, engine, sample, prompt_ids = setup(rlsdk_pm, tok, [turn1, turn2], tool_call_format="json")
    sample = run(args, sample)
    observation = "\n<|im_start|>tool\n20<|im_end|>\n<|im_start|>assistant\n"
    check_alignment(
        sample,
        prompt_ids,
        [(ids(tok, turn1), True, 1), (ids(tok, observation), False, None), (ids(tok, turn2), True, 2)],
    )
    assert "stop" not in engine.payloads[0]["sampling_params"]
    assert sample.status == Sample.Status.COMPLETED


def test_failing_slow_and_unknown_tools_become_error_observations(rlsdk_pm, small_tokenizer):
    tok = small_tokenizer
    bad_call = json.dumps({"name": "weather", "arguments": {}})
    turns = [
        "<broken>x</broken>",
        "<slow>y</slow>",
        f"<tool_call>{bad_call}</tool_call><|im_end|>",
        "Sorry.<|im_end|>",
    ]
    args, engine, sample, _ = setup(rlsdk_pm, tok, turns, tool_names=["broken", "slow"], max_turns=4)
    sample = run(args, sample)
    assert sample.status == Sample.Status.COMPLETED
    errors = sample.metadata["multi_turn"]["tool_errors"]
    assert errors[0] == "tool 'broken' failed: RuntimeError: index offline"
    assert errors[1] == "tool 'slow' timed out after 0.2s"
    assert errors[2] == "unknown tool 'weather'; available: broken, slow"
    assert "<result>\nError: tool 'broken' failed: RuntimeError: index offline\n</result>" in sample.response
    assert "Error: unknown tool 'weather'" in sample.response
    assert sample.loss_mask.count(0) > 0 and len(sample.loss_mask) == sample.response_length


def test_each_turn_is_clamped_to_the_context_left(rlsdk_pm, small_tokenizer):
    tok = small_tokenizer
    turn1 = "<calculator>1+1</calculator>"
    context = len(ids(tok, PROMPT)) + len(ids(tok, turn1)) + len(ids(tok, "\n<result>\n2\n</result>\n")) + 3
    args, engine, sample, _ = setup(
        rlsdk_pm, tok, [turn1, "So the answer is two, of course.<|im_end|>"], rollout_max_context_len=context
    )
    sample = run(args, sample)
    assert engine.payloads[1]["sampling_params"]["max_new_tokens"] == 3
    assert len(sample.tokens) == context
    assert sample.status == Sample.Status.TRUNCATED


def test_observation_that_overflows_the_budget_is_cut(rlsdk_pm, small_tokenizer):
    tok = small_tokenizer
    turn1 = "<calculator>2**60</calculator>"
    budget = len(ids(tok, turn1)) + 2
    args, engine, sample, _ = setup(rlsdk_pm, tok, [turn1], rollout_max_response_len=budget)
    sample = run(args, sample)
    assert sample.response_length == budget and sample.loss_mask[-2:] == [0, 0]
    assert sample.status == Sample.Status.TRUNCATED and len(engine.payloads) == 1


def test_abort_mid_turn_returns_partial_sample_that_resumes(rlsdk_pm, small_tokenizer):
    tok = small_tokenizer
    part1, part2 = "Let me <calcu", "lator>3*3</calculator>"
    turns = [FakeReply(part1, abort=True), part2, "Nine.<|im_end|>"]
    args, engine, sample, prompt_ids = setup(rlsdk_pm, tok, turns)
    sample = run(args, sample)
    assert sample.status == Sample.Status.ABORTED
    assert sample.tokens == prompt_ids + ids(tok, part1) and sample.loss_mask == [1] * len(ids(tok, part1))
    assert sample.metadata["multi_turn"]["turns"] == 0
    sample = run(args, sample)  # resume: the call split across the abort is still found
    assert sample.status == Sample.Status.COMPLETED
    assert engine.payloads[1]["input_ids"] == prompt_ids + ids(tok, part1)
    observation = "\n<result>\n9\n</result>\n"
    check_alignment(
        sample,
        prompt_ids,
        [
            (ids(tok, part1), True, 1),
            (ids(tok, part2), True, 2),
            (ids(tok, observation), False, None),
            (ids(tok, "Nine.<|im_end|>"), True, 3),
        ],
    )
    assert sample.metadata["multi_turn"]["turns"] == 2


def test_turn_limit_stops_with_truncated_status(rlsdk_pm, small_tokenizer):
    tok = small_tokenizer
    args, engine, sample, _ = setup(rlsdk_pm, tok, ["<calculator>1</calculator>"] * 2, max_turns=2)
    sample = run(args, sample)
    assert sample.status == Sample.Status.TRUNCATED and sample.metadata["multi_turn"]["stop"] == "max_turns"
    assert sample.metadata["multi_turn"]["tool_calls"] == 2


def test_unknown_tool_name_lists_installed(rlsdk_pm, small_tokenizer):
    args, _, sample, _ = setup(rlsdk_pm, small_tokenizer, [], tool_names=["search"])
    with pytest.raises(Exception, match="unknown tool 'search'. Choose one of: broken, calculator, slow"):
        run(args, sample)


CALCULATOR_CHAT = [
    {
        "role": "system",
        "content": "You compute with a calculator. Always start your reply with <calculator> "
        "expression </calculator>; its result comes back between <result> and </result>.",
    },
    {"role": "user", "content": "What is 3*4?"},
    {
        "role": "assistant",
        "content": "<calculator>3*4</calculator>\n<result>\n12\n</result>\nThe answer is 12.",
    },
    {"role": "user", "content": "What is 25+17?"},
    {
        "role": "assistant",
        "content": "<calculator>25+17</calculator>\n<result>\n42\n</result>\nThe answer is 42.",
    },
    {"role": "user", "content": "What is 12*7?"},
]


def test_multi_turn_on_embedded_engine(rlsdk_pm, served):
    """End to end with the real small model (greedy), one worked example making it call the tool."""
    rlsdk_pm.register(generators_plugin)
    engine = served.engine
    args = RolloutConfig(
        tool_names=["calculator"], rollout_max_response_len=32, max_turns=2, rollout_temperature=0.0
    )
    runtime = bind_runtime(args, Runtime(rlsdk_pm, engine, engine.tokenizer))
    prompt = engine.tokenizer.apply_chat_template(CALCULATOR_CHAT, tokenize=False, add_generation_prompt=True)
    try:
        sample = served.run(
            multi_turn(args, Sample(group_index=0, index=0, prompt=prompt), sampling_params_for(args))
        )
    finally:
        runtime.loop.close()
    state = sample.metadata["multi_turn"]
    assert state["tool_calls"] >= 1 and state["tool_errors"] == [], sample.response
    assert "\n<result>\n84\n</result>\n" in sample.response
    assert len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length > 0
    assert (
        len(sample.tokens)
        == len(engine.tokenizer(prompt, add_special_tokens=False)["input_ids"]) + sample.response_length
    )
    observed = [t for t, m in zip(sample.tokens[-sample.response_length :], sample.loss_mask) if not m]
    assert engine.tokenizer.decode(observed) == "\n<result>\n84\n</result>\n" * state["tool_calls"]
    assert all(lp <= 0 for lp, m in zip(sample.rollout_log_probs, sample.loss_mask) if m)
    assert any(lp < 0 for lp, m in zip(sample.rollout_log_probs, sample.loss_mask) if m)
    assert all(lp == 0.0 for lp, m in zip(sample.rollout_log_probs, sample.loss_mask) if not m)
