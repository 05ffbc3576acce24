"""Rendering chat requests to token ids (SmolLM2's tokenizer, no model): the tools and tool calls a
template cannot render come from the parser, and a continuation tokenises only what follows a recorded turn."""

from __future__ import annotations

import pytest

from rlsdk.agents.chat_template import ChatTemplate
from rlsdk.agents.server import resolve_parser
from rlsdk.plugins.manager import get_plugin_manager
from rlsdk.testing import tool_definition

TOOLS = [tool_definition("calculator", "Arithmetic.", "expression")]
CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"name": "calculator", "arguments": {"expression": "2+2"}}],
}
HERMES_STYLE = (  # written for this test: tools in the system turn, calls as <tool_call>, results as <tool_response>
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"
    "\n</tool_call>{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture
def parsers():
    pm = get_plugin_manager(load_entrypoints=False)
    return lambda name, tokenizer: resolve_parser(pm, name, tokenizer).record


def test_a_template_without_tools_gets_them_from_the_json_parser(small_tokenizer, parsers):
    template = ChatTemplate(small_tokenizer, parsers("auto", small_tokenizer))
    assert template.parser.name == "json" and not template.renders_tools
    text = template.render([{"role": "user", "content": "2+2?"}, CALL], TOOLS, add_generation_prompt=False)
    assert "You can use these tools:\n- calculator: Arithmetic." in text.split("<|im_end|>")[0]
    assert (
        '<|im_start|>assistant\n{"name": "calculator", "arguments": {"expression": "2+2"}}<|im_end|>' in text
    )


def test_a_hermes_template_renders_tools_and_calls_itself(small_tokenizer, parsers, monkeypatch):
    monkeypatch.setattr(small_tokenizer, "chat_template", HERMES_STYLE)
    template = ChatTemplate(small_tokenizer, parsers("auto", small_tokenizer))
    assert template.parser.name == "hermes" and template.renders_tools and template.renders_calls
    text = template.render([{"role": "user", "content": "2+2?"}, CALL], TOOLS, add_generation_prompt=False)
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>' in text


@pytest.mark.parametrize("hermes", [False, True])
def test_a_continuation_is_what_the_template_puts_after_the_turn(
    small_tokenizer, parsers, monkeypatch, hermes
):
    """After a turn the model ended with its end-of-turn token, the continuation starts after that token;
    after a turn cut short (no end-of-turn token), it closes the turn first."""
    if hermes:
        monkeypatch.setattr(small_tokenizer, "chat_template", HERMES_STYLE)
    template = ChatTemplate(small_tokenizer, parsers("auto", small_tokenizer))
    history = [{"role": "user", "content": "2+2?"}]
    new = [{"role": "tool", "content": "4"}]
    end = small_tokenizer.convert_tokens_to_ids("<|im_end|>")
    sampled = small_tokenizer("Let me check", add_special_tokens=False)["input_ids"]
    after_end = small_tokenizer.decode(template.continuation_ids(history, [*sampled, end], new, TOOLS))
    cut_short = small_tokenizer.decode(template.continuation_ids(history, sampled, new, TOOLS))
    tool_turn = "<|im_start|>user\n<tool_response>\n4\n</tool_response>" if hermes else "<|im_start|>tool\n4"
    assert after_end == f"\n{tool_turn}<|im_end|>\n<|im_start|>assistant\n"
    assert cut_short == f"<|im_end|>{after_end}"
