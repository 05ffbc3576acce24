"""Token ids and loss masks of a chat conversation, through the tokenizer's own chat template.

Works for any template that renders a conversation's earlier turns the same way inside the whole
conversation (ChatML, Llama, Qwen with reasoning kept, ...): each assistant turn is located by
rendering the conversation up to it, so no per-family rules are needed.
"""

from __future__ import annotations

from typing import Any

from rlsdk import Messages


def render(
    tokenizer: Any,
    messages: Messages,
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    **template_kwargs: Any,
) -> str:
    """The conversation as text, through ``tokenizer.apply_chat_template``."""
    return tokenizer.apply_chat_template(
        messages,
        tools=tools or None,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **template_kwargs,
    )


def assistant_spans(
    tokenizer: Any, messages: Messages, *, tools: list[dict[str, Any]] | None = None, **template_kwargs: Any
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character span of each assistant turn in it: from the end
    of the generation prompt to the turn's end-of-turn marker (trailing whitespace excluded)."""
    text = render(tokenizer, messages, tools=tools, **template_kwargs)
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before = render(tokenizer, messages[:i], tools=tools, add_generation_prompt=True, **template_kwargs)
        through = render(tokenizer, messages[: i + 1], tools=tools, **template_kwargs)
        for part in (before, through):
            if not text.startswith(part):
                raise ValueError(
                    f"the chat template renders the conversation up to message {i} differently than "
                    f"inside the whole conversation (it rewrites earlier turns, e.g. drops their "
                    f"reasoning), so assistant message {i} cannot be located for its loss mask"
                )
        spans.append((len(before), len(through.rstrip())))
    return text, spans


def conversation_tokens(
    tokenizer: Any, messages: Messages, *, tools: list[dict[str, Any]] | None = None, **template_kwargs: Any
) -> tuple[list[int], list[int]]:
    """Token ids of the whole conversation and a loss mask over all of them: 1 for each token that
    ends inside an assistant turn (its content and end-of-turn token), 0 for everything else."""
    if not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ValueError(f"expected a non-empty list of chat messages with a 'role', got {messages!r:.200}")
    text, spans = assistant_spans(tokenizer, messages, tools=tools, **template_kwargs)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [
        int(any(start < end_char <= end for start, end in spans)) for _, end_char in encoded["offset_mapping"]
    ]
    return list(encoded["input_ids"]), mask


def response_part(token_ids: list[int], mask: list[int]) -> tuple[int, list[int]]:
    """Split at the first trainable token: (response_length, the response's loss mask)."""
    if 1 not in mask:
        raise ValueError("the conversation has no assistant message to train on")
    first = mask.index(1)
    return len(token_ids) - first, mask[first:]
