"""Agent sessions are token-exact (issue 33's rule, on the tool agent of ``rlsdk-tool-agent`` and the real small
model): a sample holds exactly the ids the model sampled, even where re-tokenising the transcript through the
chat template gives others. Moved here from the plugin's tests: it reads ``openai_agent``'s internals."""

from __future__ import annotations

import json

import openai
import pytest

from rlsdk.agents.openai_agent import fill_sample
from rlsdk.testing import ServedEngine

pytestmark = [pytest.mark.slow, pytest.mark.plugins("rlsdk_embedded", "rlsdk_tool_agent")]


async def three_turns(client) -> list:
    """The tool agent's loop, kept going for three model turns whatever the model says: tool results for
    its calls, a nudge when it answers."""
    from rlsdk_tool_agent.agent import EXAMPLES, SYSTEM, TOOLS, run_tool

    messages = [
        {"role": "system", "content": SYSTEM},
        *EXAMPLES,
        {"role": "user", "content": "What is 37 * 91?"},
    ]
    for _ in range(3):
        reply = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, max_tokens=24
        )
        message = reply.choices[0].message
        messages.append(message)
        for call in message.tool_calls or []:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": run_tool(call.function.name, json.loads(call.function.arguments)),
                }
            )
        if not message.tool_calls:
            messages.append({"role": "user", "content": "Check it with the calculator."})
    return messages


def test_samples_are_token_exact_where_retokenising_the_transcript_is_not():
    """Sessions at temperature 1 (seeded) until one whose transcript, re-tokenised through the chat
    template, gives other ids than the model sampled; that session's sample must still hold exactly the
    sampled ids: every turn's prompt is the previous turn's prompt and sampled ids plus the new messages,
    each model turn's ids decode to the message the agent got, and only model ids train."""
    from rlsdk_embedded import EmbeddedEngine
    from rlsdk_tool_agent.agent import TOOLS

    async def sessions(served):
        chat = served.handle.chat
        server_url = served.url
        found = []
        for seed in range(12):
            session = chat.sessions.open(
                sampling={"temperature": 1.0, "sampling_seed": seed}, max_response_tokens=400
            )
            client = openai.AsyncOpenAI(
                base_url=f"{server_url}/sessions/{session.id}/v1", api_key="-", max_retries=0
            )
            await three_turns(client)
            trajectory = session.trajectory()
            transcript = session.turns[-1].path_messages(0)
            retokenised = chat.template.encode(
                chat.template.render(transcript, TOOLS, add_generation_prompt=False)
            )
            if retokenised[: len(trajectory.tokens)] != trajectory.tokens:
                found.append(session)
                break
        return chat, found

    with ServedEngine(EmbeddedEngine(device="cpu", max_batch_size=8)) as served:
        chat, found = served.run(sessions(served))
    assert found, "no seed gave a transcript that re-tokenises differently"
    session = found[0]
    tokenizer = served.engine.tokenizer
    assert len(session.turns) == 3 and session.forks() == []
    sample = fill_sample(_sample(), session, tokenizer, _agent(), {"answer": None}, "test")
    trajectory = session.trajectory()
    assert sample.tokens == trajectory.tokens and sample.response_length == len(sample.loss_mask)
    assert len(sample.rollout_log_probs) == sample.response_length
    offset = trajectory.prompt_length
    assert sample.tokens[:offset] == chat.template.encode(
        chat.template.render(session.turns[0].messages, TOOLS, add_generation_prompt=True)
    )
    for turn in session.turns:
        choice = turn.choices[0]
        assert turn.prompt_ids == sample.tokens[: len(turn.prompt_ids)]  # earlier turns' ids, reused exactly
        start = len(turn.prompt_ids) - offset
        assert sample.loss_mask[start : start + len(choice.output_ids)] == [1] * len(choice.output_ids)
        assert sample.rollout_log_probs[start : start + len(choice.output_ids)] == choice.logprobs
        text = tokenizer.decode(choice.output_ids, skip_special_tokens=True)
        parsed = chat.parser.func(text, TOOLS)
        given = choice.message
        assert (parsed.content, [(c.name, c.arguments) for c in parsed.calls]) == (
            given["content"],
            [(c["name"], c["arguments"]) for c in given.get("tool_calls", [])],
        )
    assert sum(sample.loss_mask) == sum(len(t.choices[0].output_ids) for t in session.turns)


def _sample():
    from rlsdk import Sample

    return Sample(prompt="What is 37 * 91?")


def _agent():
    from rlsdk import Agent, PluginInfo, Resolved
    from rlsdk_tool_agent.agent import tool_agent

    return Resolved(Agent(name="tool_agent", func=tool_agent), PluginInfo("tool_agent"))
