"""Loss masks from chat messages, checked token by token with SmolLM2's template and a ChatML
template with reasoning and tool calls (another family's conventions)."""

import json

import pytest

from rlsdk_generators.chat_mask import conversation_tokens, response_part
from rlsdk.testing import tool_definition

# ChatML with tools in the system turn, <think> reasoning, <tool_call> JSON and <tool_response>
# observations, in the style of Qwen's templates (written for this test).
THINK_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call these tools:"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content or '' }}"
    "{% for call in m.tool_calls or [] %}<tool_call>\n{{ call.function | tojson }}\n</tool_call>{% endfor %}"
    "<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TOOLS = [tool_definition("calculator", "Evaluate arithmetic", "expression")]


def trainable_runs(tokenizer, ids, mask):
    """The decoded text of each run of consecutive mask-1 tokens, and of each mask-0 run."""
    runs = {0: [], 1: []}
    current, start = mask[0], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != current:
            runs[current].append(tokenizer.decode(ids[start:i]))
            if i < len(mask):
                current, start = mask[i], i
    return runs


def test_smollm2_multi_turn_masks_assistant_turns_only(small_tokenizer):
    tok = small_tokenizer
    messages = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "2 + 3 = 5."},
        {"role": "user", "content": "And times 4?"},
        {"role": "assistant", "content": "5 * 4 = 20."},
    ]
    ids, mask = conversation_tokens(tok, messages)
    assert (
        ids == tok(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
    )
    assert len(mask) == len(ids)
    runs = trainable_runs(tok, ids, mask)
    assert runs[1] == ["2 + 3 = 5.<|im_end|>", "5 * 4 = 20.<|im_end|>"]
    # everything else, prompts and generation headers included, is masked out
    assert runs[0][1] == "\n<|im_start|>user\nAnd times 4?<|im_end|>\n<|im_start|>assistant\n"
    assert runs[0][0].endswith("What is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    assert runs[0][-1] == "\n"
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    for token, m in zip(ids, mask):
        if token == im_end and m:
            break
    else:
        pytest.fail("the assistant's end-of-turn token must be trainable")


def test_smollm2_tool_observation_is_masked(small_tokenizer):
    tok = small_tokenizer
    messages = [
        {"role": "user", "content": "Compute 12*7."},
        {"role": "assistant", "content": '<tool_call>{"name": "calculator"}</tool_call>'},
        {"role": "tool", "content": "84"},
        {"role": "assistant", "content": "It is 84."},
    ]
    ids, mask = conversation_tokens(tok, messages, tools=TOOLS)
    runs = trainable_runs(tok, ids, mask)
    assert runs[1] == ['<tool_call>{"name": "calculator"}</tool_call><|im_end|>', "It is 84.<|im_end|>"]
    assert "84<|im_end|>" in runs[0][1]
    response_length, loss_mask = response_part(ids, mask)
    assert loss_mask[0] == 1 and len(loss_mask) == response_length
    assert tok.decode(ids[-response_length:]).startswith("<tool_call>")


def test_chatml_think_template_with_tools(small_tokenizer):
    tok = small_tokenizer
    call = {"name": "calculator", "arguments": {"expression": "12*7"}}
    messages = [
        {"role": "user", "content": "Compute 12*7."},
        {
            "role": "assistant",
            "reasoning_content": "I should use the tool.",
            "content": "",
            "tool_calls": [{"type": "function", "function": call}],
        },
        {"role": "tool", "content": "84"},
        {"role": "assistant", "reasoning_content": "The tool said 84.", "content": "12*7 = 84."},
    ]
    ids, mask = conversation_tokens(tok, messages, tools=TOOLS, chat_template=THINK_TEMPLATE)
    runs = trainable_runs(tok, ids, mask)
    assert runs[1] == [
        "<think>\nI should use the tool.\n</think>\n\n<tool_call>\n"
        + json.dumps(call)
        + "\n</tool_call><|im_end|>",
        "<think>\nThe tool said 84.\n</think>\n\n12*7 = 84.<|im_end|>",
    ]
    assert runs[0][0].startswith("<|im_start|>system\nYou may call these tools:\n")
    assert (
        runs[0][1]
        == "\n<|im_start|>user\n<tool_response>\n84\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    # token by token: each trainable token decodes to text inside an assistant turn
    text = tok.apply_chat_template(messages, tools=TOOLS, chat_template=THINK_TEMPLATE, tokenize=False)
    assert "".join(tok.decode([t]) for t in ids) == text


def test_template_that_rewrites_history_is_an_error(small_tokenizer):
    dropping = (
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
        "{%- if m.role == 'assistant' and not loop.last %}(earlier){%- else %}{{ m.content }}{%- endif %}"
        "<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
    )
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    with pytest.raises(ValueError, match="assistant message 1"):
        conversation_tokens(small_tokenizer, messages, chat_template=dropping)


def test_no_assistant_turn_is_an_error(small_tokenizer):
    ids, mask = conversation_tokens(small_tokenizer, [{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="no assistant message"):
        response_part(ids, mask)
