"""Tool calls as models write them, through both wire formats (the ``openai`` and ``anthropic`` clients on
a real chat server on loopback): several calls in one turn, in order; arguments that are no JSON kept as
written and counted; a rewritten history kept as a tree of token segments.

The engine is :class:`rlsdk.testing.FakeEngine` with SmolLM2's real tokenizer and chat template: the turns
under test (two calls at once, a call cut short) are ones the 135M model does not write on demand, so the
engine is scripted to write them; everything else (templates, parsing, sessions, HTTP, clients) is real."""

from __future__ import annotations

import asyncio
import contextlib
import json

import anthropic
import openai
import pytest

from rlsdk import get_plugin_manager
from rlsdk.agents.server import chat_endpoint, session_record, start_chat_server
from rlsdk.agents.sessions import agent_metrics
from rlsdk.agents.tree import tree_paths
from rlsdk.testing import FakeEngine

OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    for name in ("calculator", "search")
]
ANTHROPIC_TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in OPENAI_TOOLS
]
END = "<|im_end|>"
PARALLEL = {
    "json": '{"name": "search", "arguments": {"q": "Elm"}}\n{"name": "calculator", "arguments": {"q": "2*3"}}',
    "hermes": '<tool_call>\n{"name": "search", "arguments": {"q": "Elm"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "calculator", "arguments": {"q": "2*3"}}\n</tool_call>',
}
BROKEN = {
    "json": '{"name": "calculator", "arguments": {"q": "2*3"',
    "hermes": '<tool_call>\n{"name": "calculator", "arguments": {"q": "2*3"\n</tool_call>',
}


@contextlib.asynccontextmanager
async def serve(tokenizer, replies, parser):
    """A chat server on a FakeEngine scripted with ``replies``: (engine, endpoint, server), closed after."""
    engine = FakeEngine(replies, tokenizer)
    chat = await chat_endpoint(
        engine, tokenizer, pm=get_plugin_manager(load_entrypoints=False), tool_call_parser=parser
    )
    server = await start_chat_server(chat)
    try:
        yield engine, chat, server
    finally:
        await server.close()


def openai_session(chat, server):
    """A new session and an ``openai`` client on it."""
    session = chat.sessions.open()
    return session, openai.AsyncOpenAI(base_url=f"{server.url}/sessions/{session.id}/v1", api_key="-")


def anthropic_session(chat, server):
    """A new session and an ``anthropic`` client on it."""
    session = chat.sessions.open()
    return session, anthropic.AsyncAnthropic(base_url=f"{server.url}/sessions/{session.id}", api_key="-")


def run(coroutine_function):
    return asyncio.run(coroutine_function())


def converse(tokenizer, replies, parser, question, result):
    """``question`` in a session of each API on a chat server scripted with ``replies``, every tool call of
    the model's reply answered with ``result``, then the model's next turn: ((the ``openai`` session, its
    first reply), (the ``anthropic`` session, its first answer))."""

    async def go():
        async with serve(tokenizer, replies, parser) as (_, chat, server):
            oa_session, oa = openai_session(chat, server)
            messages = [{"role": "user", "content": question}]
            reply = await oa.chat.completions.create(model="m", messages=messages, tools=OPENAI_TOOLS)
            message = reply.choices[0].message
            messages.append(message)
            messages += [
                {"role": "tool", "tool_call_id": c.id, "content": result} for c in message.tool_calls
            ]
            await oa.chat.completions.create(model="m", messages=messages, tools=OPENAI_TOOLS)

            an_session, an = anthropic_session(chat, server)
            asked = [{"role": "user", "content": question}]
            answer = await an.messages.create(model="m", max_tokens=64, messages=asked, tools=ANTHROPIC_TOOLS)
            calls = [b for b in answer.content if b.type == "tool_use"]
            results = [{"type": "tool_result", "tool_use_id": b.id, "content": result} for b in calls]
            asked += [{"role": "assistant", "content": answer.content}, {"role": "user", "content": results}]
            await an.messages.create(model="m", max_tokens=64, messages=asked, tools=ANTHROPIC_TOOLS)
            return (oa_session, reply), (an_session, answer)

    return run(go)


@pytest.mark.parametrize("parser", ["json", "hermes"])
def test_parallel_calls_keep_their_order_in_both_apis_and_the_session_continues(small_tokenizer, parser):
    replies = [PARALLEL[parser] + END, "Done." + END] * 2
    question = "Look up Elm and compute 2*3."
    (oa_session, reply), (an_session, answer) = converse(small_tokenizer, replies, parser, question, "ok")
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in message.tool_calls] == ["search", "calculator"]
    assert [json.loads(c.function.arguments) for c in message.tool_calls] == [{"q": "Elm"}, {"q": "2*3"}]
    assert answer.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in answer.content] == [
        ("tool_use", "search", {"q": "Elm"}),
        ("tool_use", "calculator", {"q": "2*3"}),
    ]
    for session in (oa_session, an_session):
        assert [t.parent for t in session.turns] == [None, (0, 0)] and session.forks() == []
        first, second = session.turns
        assert second.prompt_ids[: second.reused] == first.prompt_ids + first.choices[0].output_ids
        # the two tool results follow the calls in order, after the sampled ids
        between = small_tokenizer.decode(second.prompt_ids[second.reused :])
        assert between.count("ok") == 2
    # both APIs made the same internal turns: the same prompt ids, the same recorded tokens
    assert [t.prompt_ids for t in oa_session.turns] == [t.prompt_ids for t in an_session.turns]


@pytest.mark.parametrize("parser", ["json", "hermes"])
def test_malformed_arguments_are_kept_as_written_and_counted(small_tokenizer, parser):
    replies = [BROKEN[parser] + END, "Sorry." + END] * 2
    (oa_session, reply), (an_session, answer) = converse(
        small_tokenizer, replies, parser, "Compute 2*3.", "bad"
    )
    [call] = reply.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == ("calculator", '{"q": "2*3"')
    [block] = answer.content
    assert (block.name, block.input) == ("calculator", {"INVALID_JSON": '{"q": "2*3"'})
    sampled = small_tokenizer(BROKEN[parser] + END, add_special_tokens=False)["input_ids"]
    for session in (oa_session, an_session):
        # sent back as it came, the broken call matches the recorded turn: its sampled ids are reused
        assert [t.parent for t in session.turns] == [None, (0, 0)] and session.forks() == []
        assert session.turns[0].choices[0].output_ids == sampled
        assert session.turns[1].prompt_ids[: session.turns[1].reused][-len(sampled) :] == sampled
        assert [c.malformed_calls for t in session.turns for c in t.choices] == [1, 0]


def test_a_rewritten_history_is_kept_as_a_tree_of_token_segments(small_tokenizer):
    """The agent edits its first question after two turns, then drops the model's first answer: each
    rewrite is a branch; every recorded (turn, choice) is a path of the tree, token for token."""
    replies = ["<think>hmm</think>It is 6." + END, "Yes." + END, "Six." + END, "Ok." + END]

    async def go():
        async with serve(small_tokenizer, replies, "json") as (engine, chat, server):
            session, oa = openai_session(chat, server)

            async def ask(messages):
                return (await oa.chat.completions.create(model="m", messages=messages)).choices[0].message

            first = [{"role": "user", "content": "What is 2*3?"}]
            answer = await ask(first)
            await ask([*first, answer, {"role": "user", "content": "Sure?"}])
            await ask([{"role": "user", "content": "What is 2 times 3?"}])  # the question edited
            stripped = {"role": "assistant", "content": "It is 6."}  # old reasoning dropped
            await ask([*first, stripped, {"role": "user", "content": "Sure?"}])
            return session

    session = run(go)
    tree = session_record(session)["tree"]
    assert tree["format"] == "rlsdk.trajectory_tree/1" and tree["branches"] == 3
    assert [f["reason"] for f in session.forks()] == ["new_root", "new_root"]
    paths = tree_paths(tree)
    assert set(paths) == {(0, 0), (1, 0), (2, 0), (3, 0)}
    for leaf, path in paths.items():
        expected = session.path(leaf)
        assert path["tokens"] == expected.tokens
        assert path["loss_mask"] == [0] * expected.prompt_length + expected.loss_mask
        assert path["logprobs"] == [0.0] * expected.prompt_length + expected.rollout_log_probs
    # the roots share the system and user header: one segment, then the branches
    nodes = tree["nodes"]
    roots = [n for n in nodes if n["parent"] is None]
    assert len(roots) == 1 and sum(n["parent"] == roots[0]["id"] for n in nodes) == 2
    # the trained branch is the latest turn's path
    trained = [x for i in tree["trained"] for x in nodes[i]["tokens"]]
    assert trained == session.trajectory().tokens and tree["trained_turns"] == [[3, 0]]


def test_agent_metrics_count_branches_and_malformed_calls():
    from rlsdk import Sample

    samples = [Sample(index=i) for i in range(2)]
    samples[0].metadata["agent"] = {"turns": 3, "forks": [{}], "branches": 2, "malformed_tool_calls": 1}
    samples[1].metadata["agent"] = {"turns": 2, "forks": [], "branches": 1, "malformed_tool_calls": 0}
    metrics = agent_metrics(samples)
    assert metrics["agent/branches"] == 3 and metrics["agent/malformed_tool_calls"] == 1
    assert metrics["agent/fork_rate"] == pytest.approx(1 / 3)
    assert metrics["agent/fork_rate_per_session"] == pytest.approx((1 / 2 + 0) / 2)
