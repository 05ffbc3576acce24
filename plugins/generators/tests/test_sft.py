"""The ``sft`` rollout on rlsdk's data source; the masks come from the real tokenizer. The engine is
``rlsdk.testing.FakeEngine`` with no turns: the sft rollout never generates."""

import json

import pytest

import rlsdk_filter_hub.plugin
from rlsdk import RolloutConfig, Sample
from rlsdk import DataSource
from rlsdk import DataError
from rlsdk import Runtime
from rlsdk.testing import bind_runtime
from rlsdk.testing import FakeEngine
from rlsdk_generators import plugin as generators_plugin
from rlsdk_generators.chat_mask import conversation_tokens


def sft_source(pm, tokenizer, path, rows, rollout="sft", **options):
    """The data source as `rlsdk run --rollout sft` builds it: chat messages kept as they are."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pm.register(generators_plugin)
    pm.register(rlsdk_filter_hub.plugin)
    args = RolloutConfig(prompt_data=str(path), input_key="messages", n_samples_per_prompt=1, **options)
    keep = pm.resolve("generate_rollout", rollout).record.chat_messages
    bind_runtime(args, Runtime(pm, FakeEngine([], tokenizer), tokenizer))
    return args, DataSource(args, pm=pm, tokenizer=tokenizer, keep_messages=keep)


def test_sft_rollout_fills_tokens_and_masks(rlsdk_pm, small_tokenizer, tmp_path):
    chats = [
        [
            {"role": "user", "content": f"Say {i}."},
            {"role": "assistant", "content": f"{i}."},
            {"role": "user", "content": "Again."},
            {"role": "assistant", "content": f"{i} again."},
        ]
        for i in range(3)
    ]
    args, source = sft_source(
        rlsdk_pm,
        small_tokenizer,
        tmp_path / "chats.jsonl",
        [{"messages": c} for c in chats],
        rollout_batch_size=2,
    )
    output = rlsdk_pm.resolve("generate_rollout", "sft").func(args, 0, source)
    assert len(output.samples) == 2 and source.metrics()["groups_served_fresh"] == 2
    sample = output.samples[1][0]
    ids, mask = conversation_tokens(small_tokenizer, chats[1])
    first = mask.index(1)
    assert (
        sample.tokens == ids
        and sample.loss_mask == mask[first:]
        and sample.response_length == len(ids) - first
    )
    assert (
        sample.response
        == "1.<|im_end|>\n<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n1 again.<|im_end|>\n"
    )
    assert sample.status == Sample.Status.COMPLETED and sample.reward == 0.0
    assert output.metrics["rollout/sft/response_tokens"] == sum(
        s.response_length for g in output.samples for s in g
    )


def test_sft_rollout_names_the_bad_sample(rlsdk_pm, small_tokenizer, tmp_path):
    rows = [{"messages": "plain text"}, {"messages": [{"role": "user", "content": "hi"}]}]
    args, source = sft_source(
        rlsdk_pm, small_tokenizer, tmp_path / "bad.jsonl", rows, rollout_batch_size=1, rollout_shuffle=False
    )
    sft = rlsdk_pm.resolve("generate_rollout", "sft").func
    with pytest.raises(ValueError, match="sample 0/0: the sft rollout needs chat messages"):
        sft(args, 0, source)
    with pytest.raises(ValueError, match="sample 1/1: the conversation has no assistant message"):
        sft(args, 1, source)


def test_rollouts_that_generate_still_refuse_untemplated_messages(rlsdk_pm, small_tokenizer, tmp_path):
    with pytest.raises(DataError, match="--apply-chat-template"):
        sft_source(
            rlsdk_pm,
            small_tokenizer,
            tmp_path / "chat.jsonl",
            [{"messages": [{"role": "user", "content": "hi"}]}],
            rollout="sglang",
        )
