"""``/v1/chat/completions`` and sessions on the real small model (SmolLM2-135M-Instruct served by
``rlsdk serve``'s server on loopback), called with the ``openai`` client; and the same endpoint as a proxy
in front of an SGLang-protocol server (``rlsdk serve`` stands in for SGLang, which needs a GPU)."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest


pytestmark = pytest.mark.slow
SHOTS = [
    {"role": "user", "content": "What is 12 * 3?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "12 * 3"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "36"},
    {"role": "assistant", "content": "The answer is 36."},
]


def session(served) -> tuple[str, openai.OpenAI]:
    sid = httpx.post(served.url + "/sessions").json()["id"]
    return sid, openai.OpenAI(base_url=f"{served.url}/sessions/{sid}/v1", api_key="-", max_retries=0)


def record(served, sid: str) -> dict:
    return httpx.get(f"{served.url}/sessions/{sid}").json()


def ask(client, messages, **options):
    return client.chat.completions.create(
        model="m", messages=messages, temperature=0, max_tokens=24, **options
    )


def test_models_and_a_plain_completion(served):
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="-", max_retries=0)
    assert [m.id for m in client.models.list()] == [str(served.engine.model_path)]
    reply = ask(client, [{"role": "user", "content": "Say hello."}], logprobs=True)
    choice = reply.choices[0]
    assert choice.message.content and choice.finish_reason in ("stop", "length")
    assert len(choice.logprobs.content) == reply.usage.completion_tokens
    assert all(t.logprob <= 0 for t in choice.logprobs.content)


def test_a_tool_call_comes_back_as_tool_calls(served, calculator):
    _, client = session(served)
    reply = ask(client, [*SHOTS, {"role": "user", "content": "What is 37 * 91?"}], tools=calculator.openai)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls[0].function.name == "calculator"


def test_continuing_reuses_recorded_ids_exactly_and_edits_fork(served, calculator):
    sid, client = session(served)
    messages = [*SHOTS, {"role": "user", "content": "What is 37 * 91?"}]
    first = ask(client, messages, tools=calculator.openai).choices[0].message
    messages += [first, {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "3367"}]
    ask(client, messages, tools=calculator.openai)
    turns = record(served, sid)["turns"]
    assert [t["parent"] for t in turns] == [None, [0, 0]] and record(served, sid)["forks"] == []
    assert (
        turns[1]["prompt_ids"][: turns[1]["reused"]]
        == turns[0]["prompt_ids"] + turns[0]["choices"][0]["output_ids"]
    )
    # the agent edits the tool result it sent: a fork from the first turn, recorded with where it diverged
    edited = [*messages[:-1], {"role": "tool", "tool_call_id": "x", "content": "4000"}]
    ask(client, edited, tools=calculator.openai)
    # the agent sends the same request again: a resample, also a fork
    ask(client, messages, tools=calculator.openai)
    forks = record(served, sid)["forks"]
    assert [(f["turn"], f["reason"], f["diverged_at"]) for f in forks] == [
        (2, "edited", len(messages) - 1),
        (3, "resampled", len(messages)),
    ]
    trajectory = record(served, sid)["trajectory"]
    assert trajectory["turns"] == [[0, 0], [3, 0]]
    assert len(trajectory["tokens"]) == trajectory["prompt_length"] + len(trajectory["loss_mask"])
    assert len(trajectory["rollout_log_probs"]) == len(trajectory["loss_mask"])


def test_streaming_gives_the_same_turn_as_a_whole_answer(served):
    _, client = session(served)
    messages = [{"role": "user", "content": "Count from one to five."}]
    whole = ask(client, messages, seed=3).choices[0]
    chunks = list(ask(client, messages, seed=3, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.finish_reason
    assert chunks[-1].usage.completion_tokens > 0


def test_streamed_tool_calls_arrive_at_the_end_with_nothing_of_the_json_as_content(served, calculator):
    _, client = session(served)
    chunks = list(
        ask(
            client,
            [*SHOTS, {"role": "user", "content": "What is 37 * 91?"}],
            tools=calculator.openai,
            stream=True,
        )
    )
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)
    calls = [call for c in chunks for call in c.choices[0].delta.tool_calls or []]
    assert [call.function.name for call in calls] == ["calculator"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_n_choices_and_stop_sequences(served):
    sid, client = session(served)
    messages = [{"role": "user", "content": "List three colours, one per line."}]
    reply = client.chat.completions.create(
        model="m", messages=messages, n=3, temperature=1.0, max_tokens=24, stop=["\n"]
    )
    assert len(reply.choices) == 3 and [c.index for c in reply.choices] == [0, 1, 2]
    assert all("\n" not in (c.message.content or "") for c in reply.choices)
    assert len(record(served, sid)["turns"][0]["choices"]) == 3
    # continuing the second choice attaches to it, without a fork
    ask(client, [*messages, reply.choices[1].message, {"role": "user", "content": "One more."}])
    turns = record(served, sid)["turns"]
    assert turns[1]["parent"] == [0, 1] and turns[1]["fork"] is None


def test_errors_have_openais_shape(served, calculator):
    client = openai.OpenAI(base_url=f"{served.url}/sessions/nope/v1", api_key="-", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="no open session"):
        ask(client, [{"role": "user", "content": "x"}])
    _, client = session(served)
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        ask(client, [{"role": "user", "content": "x"}], tools=calculator.openai, tool_choice="required")


def test_a_proxy_in_front_of_an_sglang_protocol_server(served):
    """The chat endpoint on an SGLang client (what fronts a real SGLang server or router) records the same
    exact tokens as the engine's own."""
    from rlsdk.agents.server import chat_endpoint, start_chat_server
    from rlsdk.engines.sglang_client import SGLangClient

    async def run() -> tuple[dict, dict]:
        upstream = SGLangClient(served.url)
        chat = await chat_endpoint(upstream, served.engine.tokenizer)
        server = await start_chat_server(chat)
        try:
            sid = chat.sessions.open().id
            client = openai.AsyncOpenAI(
                base_url=f"{server.url}/sessions/{sid}/v1", api_key="-", max_retries=0
            )
            messages = [{"role": "user", "content": "Name a fruit."}]
            first = await client.chat.completions.create(
                model="m", messages=messages, temperature=0, max_tokens=12
            )
            messages += [first.choices[0].message, {"role": "user", "content": "Another one."}]
            await client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=12)
            models = (await client.models.list()).model_dump()
            return chat.sessions.get(sid), models
        finally:
            await server.close()
            await upstream.close()

    recorded, models = served.run(run())
    assert models["data"][0]["id"] == str(served.engine.model_path)
    assert [t.parent for t in recorded.turns] == [None, (0, 0)] and recorded.forks() == []
    trajectory = recorded.trajectory()
    assert (
        trajectory.tokens[: recorded.turns[1].reused]
        == recorded.turns[0].prompt_ids + recorded.turns[0].choices[0].output_ids
    )
    assert sum(trajectory.loss_mask) == sum(len(t.choices[0].output_ids) for t in recorded.turns)


def test_a_session_is_closed_with_its_record(served):
    sid, client = session(served)
    ask(client, [{"role": "user", "content": "Hi"}])
    closed = httpx.delete(f"{served.url}/sessions/{sid}").json()
    assert closed["trajectory"]["prompt_length"] > 0
    assert httpx.get(f"{served.url}/sessions/{sid}").status_code == 404


def test_rlsdk_serve_upstream_fronts_a_server_with_the_chat_endpoint(served):
    """``rlsdk serve --upstream URL --model TOKENIZER`` in a subprocess: the OpenAI endpoint and sessions in
    front of an SGLang-protocol server."""
    import re
    import subprocess
    import sys

    command = [
        sys.executable,
        "-m",
        "rlsdk_cli.app",
        "serve",
        "--upstream",
        served.url,
        "--model",
        str(served.engine.model_path),
        "--port",
        "0",
    ]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stderr.readline()
        url = re.search(r"at (http://\S+)", line).group(1)
        sid = httpx.post(url + "/sessions").json()["id"]
        client = openai.OpenAI(base_url=f"{url}/sessions/{sid}/v1", api_key="-", max_retries=0)
        reply = ask(client, [{"role": "user", "content": "Say yes."}])
        assert reply.choices[0].message.content
        trajectory = httpx.get(f"{url}/sessions/{sid}").json()["trajectory"]
        assert sum(trajectory["loss_mask"]) == reply.usage.completion_tokens
    finally:
        process.terminate()
        process.wait(timeout=30)


def run_agent(served, agent_args, func, *, sample_index: int = 1, after=None):
    """``openai_agent`` on one sample, in a run whose engine is ``served`` (its loopback server's endpoint)."""
    from rlsdk import Sample
    from rlsdk.agents.openai_agent import openai_agent

    args = agent_args(served, func)
    sample = Sample(group_index=0, index=sample_index, prompt="Say hi.")
    params = {"temperature": 0.0, "max_new_tokens": 64}

    async def go():
        if after is not None:
            task = asyncio.ensure_future(after())
        try:
            return await openai_agent(args, sample, params)
        finally:
            if after is not None:
                await task

    return served.run(go())


def test_openai_agent_fills_the_sample_from_a_sync_agents_session(served, agent_args):
    def sync_agent(args, sample, client):
        assert isinstance(client, openai.OpenAI)
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": sample.prompt}], max_tokens=8
        )
        return {"said": reply.choices[0].message.content}

    sample = run_agent(served, agent_args, sync_agent)
    agent = sample.metadata["agent"]
    assert agent["name"] == "under_test" and agent["turns"] == 1 and agent["forks"] == []
    assert agent["messages"][-1] == {"role": "assistant", "content": agent["result"]["said"]}
    assert sample.loss_mask == [1] * sample.response_length and 0 < sample.response_length <= 8
    assert (
        served.engine.tokenizer.decode(sample.tokens[-sample.response_length :], skip_special_tokens=True)
        == agent["result"]["said"]
    )


def test_a_failing_agent_is_named_with_its_plugin_and_sample(served, agent_args):
    from rlsdk.errors import PluginCallError

    async def broken(args, sample, client):
        raise ValueError("no idea")

    async def silent(args, sample, client):
        return "nothing asked"

    with pytest.raises(
        PluginCallError, match=r"agent 'under_test' from .* on sample 0/1 raised ValueError: no idea"
    ):
        run_agent(served, agent_args, broken)
    with pytest.raises(PluginCallError, match="made no chat request"):
        run_agent(served, agent_args, silent)


def test_an_aborted_turn_returns_the_sample_unfinished(served, agent_args):
    from rlsdk import Sample

    async def talker(args, sample, client):
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Tell a story."}], max_tokens=200
        )

    async def abort_soon():
        await asyncio.sleep(1.0)
        await served.engine.abort()

    sample = run_agent(served, agent_args, talker, after=abort_soon)
    assert sample.status is Sample.Status.ABORTED and sample.response_length == 0


def test_a_failing_tool_call_parser_is_named(served, calculator):
    from rlsdk import ToolCallParser, get_plugin_manager, hookimpl
    from rlsdk.agents.server import chat_endpoint, start_chat_server

    def broken(text, tools):
        raise KeyError("oops")

    class Parsers:
        @hookimpl
        def rlsdk_tool_call_parsers(self):
            yield ToolCallParser(name="broken", func=broken, tools_prompt=lambda tools: "Tools: calculator.")

    async def run() -> httpx.Response:
        pm = get_plugin_manager(load_entrypoints=False, plugins=[Parsers()])
        chat = await chat_endpoint(served.engine, served.engine.tokenizer, pm=pm, tool_call_parser="broken")
        server = await start_chat_server(chat)
        try:
            async with httpx.AsyncClient(timeout=300) as client:
                body = {
                    "messages": [{"role": "user", "content": "Hi"}],
                    "tools": calculator.openai,
                    "max_tokens": 4,
                }
                return await client.post(server.url + "/v1/chat/completions", json=body)
        finally:
            await server.close()

    response = served.run(run())
    assert response.status_code == 500
    assert "tool_call_parser 'broken' from plugin" in response.json()["error"]["message"]
    assert "raised KeyError" in response.json()["error"]["message"]
