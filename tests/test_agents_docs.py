"""The two agents of docs/agents.md (one written with the ``openai`` client, one with ``anthropic``) run as
printed, each through a session of a real chat server on loopback with SmolLM2's tokenizer and template.

The engine is :class:`rlsdk.testing.FakeEngine`, scripted to call the calculator and then answer: what the
135M model writes is not up to the test, and the point is that the printed agents run and are recorded."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import anthropic
import openai
import pytest

from rlsdk import Sample, get_plugin_manager
from rlsdk.agents.server import chat_endpoint, start_chat_server
from rlsdk.testing import FakeEngine

DOCS = Path(__file__).parents[1] / "docs" / "agents.md"


def examples() -> dict[str, str]:
    """The python blocks of docs/agents.md, by the agent function each defines."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.DOTALL)
    return {re.search(r"async def (\w+)", block).group(1): block for block in blocks}


@pytest.mark.parametrize("name", ["openai_calculator_agent", "anthropic_calculator_agent"])
def test_the_documented_agents_run_and_are_recorded(small_tokenizer, name):
    namespace: dict = {}
    exec(compile(examples()[name], str(DOCS), "exec"), namespace)
    agent = namespace[name]
    call = '{"name": "calculator", "arguments": {"expression": "6 * 7"}}<|im_end|>'

    async def go():
        engine = FakeEngine([call, "It is 42.<|im_end|>"], small_tokenizer)
        chat = await chat_endpoint(engine, small_tokenizer, pm=get_plugin_manager(load_entrypoints=False))
        server = await start_chat_server(chat)
        session = chat.sessions.open()
        try:
            if name.startswith("openai"):
                client = openai.AsyncOpenAI(base_url=f"{server.url}/sessions/{session.id}/v1", api_key="-")
            else:
                client = anthropic.AsyncAnthropic(base_url=f"{server.url}/sessions/{session.id}", api_key="-")
            result = await agent(None, Sample(prompt="What is 6 * 7?"), client)
        finally:
            await server.close()
        return result, session

    result, session = asyncio.run(go())
    assert result == {"answer": "It is 42."}
    assert [t.parent for t in session.turns] == [None, (0, 0)] and session.forks() == []
    second = session.turns[1]
    assert "42" in small_tokenizer.decode(second.prompt_ids[second.reused :])  # the tool's result
