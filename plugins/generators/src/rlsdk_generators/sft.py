"""The ``sft`` rollout: supervised fine-tuning data through the RL loop, loss masks from chat messages."""

from __future__ import annotations

from typing import Any

from rlsdk import RolloutFnTrainOutput, Sample, get_runtime

from .chat_mask import conversation_tokens, response_part


def fill_from_messages(
    args: Any,
    tokenizer: Any,
    sample: Sample,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
) -> Sample:
    """Set ``tokens``, ``response_length`` and ``loss_mask`` of ``sample`` from a whole conversation;
    the response starts at the first assistant token."""
    try:
        token_ids, mask = conversation_tokens(
            tokenizer, messages, tools=tools, **(getattr(args, "apply_chat_template_kwargs", None) or {})
        )
        response_length, loss_mask = response_part(token_ids, mask)
    except Exception as exc:
        raise ValueError(f"sample {sample.group_index}/{sample.index}: {exc}") from exc
    sample.tokens = token_ids
    sample.response_length = response_length
    sample.loss_mask = loss_mask
    sample.response = tokenizer.decode(token_ids[len(token_ids) - response_length :])
    sample.status = Sample.Status.COMPLETED
    return sample


def sft(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> RolloutFnTrainOutput:
    """SFT batches: each sample's chat messages tokenized with loss mask 1 on assistant turns only."""
    if evaluation:
        raise ValueError("the sft rollout has no eval mode: set --eval-function-path to an eval rollout")
    tokenizer = get_runtime(args).tokenizer
    if tokenizer is None:
        raise RuntimeError("the sft rollout needs the run's tokenizer (its chat template)")
    groups = data_source.get_samples(args.rollout_batch_size)
    tokens = 0
    for group in groups:
        for sample in group:
            if isinstance(sample.prompt, str):
                raise ValueError(
                    f"sample {sample.group_index}/{sample.index}: the sft rollout needs chat messages as "
                    f"the prompt; turn --apply-chat-template off so the data source keeps them"
                )
            fill_from_messages(args, tokenizer, sample, sample.prompt, sample.metadata.get("tools"))
            sample.reward = 0.0
            tokens += sample.response_length
    return RolloutFnTrainOutput(samples=groups, metrics={"rollout/sft/response_tokens": tokens})
