"""The ``sft`` rollout. ``ListSource`` stands in for rlsdk's data source (built on another branch)
with the one call the rollout makes, ``get_samples(n)``; the masks come from the real tokenizer."""

import pytest

from rlsdk import RolloutConfig, Sample
from rlsdk.runtime import Runtime, bind_runtime
from rlsdk.testing import ScriptedEngine
from rlsdk_generators import plugin as generators_plugin
from rlsdk_generators.chat_mask import conversation_tokens


class ListSource:
    def __init__(self, groups):
        self.groups = groups

    def get_samples(self, n):
        taken, self.groups = self.groups[:n], self.groups[n:]
        return taken


def test_sft_rollout_fills_tokens_and_masks(rlsdk_pm, small_tokenizer):
    rlsdk_pm.register(generators_plugin)
    args = RolloutConfig(rollout_batch_size=2, n_samples_per_prompt=1)
    bind_runtime(args, Runtime(rlsdk_pm, ScriptedEngine(small_tokenizer, []), small_tokenizer))
    chats = [[{"role": "user", "content": f"Say {i}."}, {"role": "assistant", "content": f"{i}."},
              {"role": "user", "content": "Again."}, {"role": "assistant", "content": f"{i} again."}] for i in range(3)]
    source = ListSource([[Sample(group_index=i, index=i, prompt=chat)] for i, chat in enumerate(chats)])
    output = rlsdk_pm.resolve("generate_rollout", "sft").func(args, 0, source)
    assert len(output.samples) == 2 and len(source.groups) == 1
    sample = output.samples[1][0]
    ids, mask = conversation_tokens(small_tokenizer, chats[1])
    first = mask.index(1)
    assert sample.tokens == ids and sample.loss_mask == mask[first:] and sample.response_length == len(ids) - first
    assert sample.response == "1.<|im_end|>\n<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n1 again.<|im_end|>\n"
    assert sample.status == Sample.Status.COMPLETED and sample.reward == 0.0
    assert output.metrics["rollout/sft/response_tokens"] == sum(s.response_length for g in output.samples for s in g)


def test_sft_rollout_names_the_bad_sample(rlsdk_pm, small_tokenizer):
    rlsdk_pm.register(generators_plugin)
    args = RolloutConfig(rollout_batch_size=1)
    bind_runtime(args, Runtime(rlsdk_pm, ScriptedEngine(small_tokenizer, []), small_tokenizer))
    sft = rlsdk_pm.resolve("generate_rollout", "sft").func
    with pytest.raises(ValueError, match="sample 0/3: the sft rollout needs chat messages"):
        sft(args, 0, ListSource([[Sample(group_index=0, index=3, prompt="plain text")]]))
    with pytest.raises(ValueError, match="sample 0/4: the conversation has no assistant message"):
        sft(args, 0, ListSource([[Sample(group_index=0, index=4, prompt=[{"role": "user", "content": "hi"}])]]))
