"""The contract kit's Anthropic path and chat tokenizer (issue 56): an agent on the real ``anthropic`` client (and
one on ``openai``) runs through ``check_agent`` against a FakeEngine with ``rlsdk.testing.ChatTokenizer``, served
on loopback; a tokenizer without a chat template is named, not a 500; a generator that renders its own prompt
passes ``check_custom_generate``."""

from __future__ import annotations

import httpx
import pytest

from rlsdk import Agent, CustomGenerate, get_plugin_manager, hookimpl, model_turn
from rlsdk.testing import ChatTokenizer, FakeEngine, ServedEngine, check_agent, check_custom_generate

pytest.importorskip("anthropic")
pytest.importorskip("openai")


async def asks_claude(args, sample, client):
    """An agent written with the anthropic client, a system prompt of its own."""
    reply = await client.messages.create(
        model="policy",
        max_tokens=64,
        system="Answer in one word.",
        messages=[{"role": "user", "content": sample.prompt}],
    )
    return reply.content[0].text


def asks_gpt(args, sample, client):
    """A sync agent on the openai client."""
    reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": sample.prompt}])
    return reply.choices[0].message.content


class Agents:
    @hookimpl
    def rlsdk_agents(self):
        yield Agent(name="asks_claude", func=asks_claude)
        yield Agent(name="asks_gpt", func=asks_gpt)


def test_check_agent_runs_an_anthropic_client_agent_and_an_openai_one():
    pm = get_plugin_manager(load_entrypoints=False, plugins=[Agents()])
    with ServedEngine(FakeEngine(["Hello.<|im_end|>"] * 2, ChatTokenizer())) as served:
        sample = check_agent(pm, "asks_claude", served, generator="anthropic_agent")
        assert sample.metadata["agent"]["result"] == "Hello."
        text = ChatTokenizer().decode(sample.tokens)
        assert text.startswith("<|im_start|>system\nAnswer in one word.<|im_end|>\n<|im_start|>user\nSay hi.")
        assert check_agent(pm, "asks_gpt", served).metadata["agent"]["result"] == "Hello."


def test_chat_tokenizer_renders_chatml():
    text = ChatTokenizer().apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_a_served_engine_without_a_chat_template_says_so():
    with ServedEngine(FakeEngine(["x"])) as served:
        for path in ("/v1/chat/completions", "/v1/messages"):
            answer = httpx.post(served.url + path, json={"model": "m", "messages": []}, timeout=30)
            assert answer.status_code == 404, answer.text
            message = answer.json()["message"]
            assert "ByteTokenizer" in message and "has no chat template" in message and "ChatTokenizer" in message
        pm = get_plugin_manager(load_entrypoints=False, plugins=[Agents()])
        with pytest.raises(AssertionError, match="has no chat template"):
            check_agent(pm, "asks_gpt", served)


async def with_system_prompt(args, sample, sampling_params):
    """Renders its own prompt: a system line before the question."""
    tokenizer = ChatTokenizer()
    prompt = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": sample.prompt}],
        add_generation_prompt=True,
    )
    sample.prompt, sample.tokens = prompt, tokenizer(prompt)["input_ids"]
    await model_turn(args, sample, sampling_params)
    return sample


def test_check_custom_generate_takes_a_generator_that_renders_its_own_prompt():
    class Generators:
        @hookimpl
        def rlsdk_custom_generates(self):
            yield CustomGenerate(name="with_system_prompt", func=with_system_prompt)

    pm = get_plugin_manager(load_entrypoints=False, plugins=[Generators()])
    sample = check_custom_generate(pm, "with_system_prompt", ["Five.<|im_end|>"], tokenizer=ChatTokenizer())
    assert sample.response.startswith("Five.") and sample.prompt.startswith("<|im_start|>system")
