"""``/v1/messages`` (Anthropic's Messages API) on the real small model (SmolLM2-135M-Instruct served by
``rlsdk serve``'s server on loopback), called with the ``anthropic`` client: the same sessions and
token-exact recording as ``/v1/chat/completions``, and the ``anthropic_agent`` custom_generate."""

from __future__ import annotations

import anthropic
import httpx
import pytest


pytestmark = pytest.mark.slow
SHOTS = [
    {"role": "user", "content": "What is 12 * 3?"},
    {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "t1", "name": "calculator", "input": {"expression": "12 * 3"}}
        ],
    },
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "36"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "The answer is 36."}]},
]
GREEDY = {"temperature": 0}  # the newest client sends no sampling parameters of its own


def session(served) -> tuple[str, anthropic.Anthropic]:
    sid = httpx.post(served.url + "/sessions").json()["id"]
    return sid, anthropic.Anthropic(base_url=f"{served.url}/sessions/{sid}", api_key="-", max_retries=0)


def record(served, sid: str) -> dict:
    return httpx.get(f"{served.url}/sessions/{sid}").json()


def test_a_message_with_a_system_prompt_is_recorded_token_for_token(served):
    sid, client = session(served)
    reply = client.messages.create(
        model="m",
        max_tokens=16,
        system="Be brief.",
        messages=[{"role": "user", "content": "Say hello."}],
        extra_body=GREEDY,
    )
    assert reply.type == "message" and reply.role == "assistant"
    assert reply.stop_reason in ("end_turn", "max_tokens") and reply.content[0].type == "text"
    turn = record(served, sid)["turns"][0]
    assert reply.usage.input_tokens == len(turn["prompt_ids"])
    assert reply.usage.output_tokens == len(turn["choices"][0]["output_ids"])
    assert turn["messages"][0] == {"role": "system", "content": "Be brief."}
    text = served.engine.tokenizer.decode(turn["choices"][0]["output_ids"], skip_special_tokens=True)
    assert text.strip() == reply.content[0].text


def test_tool_use_and_tool_result_continue_the_recorded_turn(served, calculator):
    sid, client = session(served)
    messages = [*SHOTS, {"role": "user", "content": "What is 37 * 91?"}]
    first = client.messages.create(
        model="m", max_tokens=32, messages=messages, tools=calculator.anthropic, extra_body=GREEDY
    )
    assert first.stop_reason == "tool_use"
    use = next(block for block in first.content if block.type == "tool_use")
    assert use.name == "calculator" and "expression" in use.input
    messages += [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "3367"}]},
    ]
    client.messages.create(
        model="m", max_tokens=16, messages=messages, tools=calculator.anthropic, extra_body=GREEDY
    )
    session_record = record(served, sid)
    turns = session_record["turns"]
    assert [t["parent"] for t in turns] == [None, [0, 0]] and session_record["forks"] == []
    assert (
        turns[1]["prompt_ids"][: turns[1]["reused"]]
        == turns[0]["prompt_ids"] + turns[0]["choices"][0]["output_ids"]
    )
    assert served.engine.tokenizer.decode(turns[1]["prompt_ids"][turns[1]["reused"] :]).count("3367") == 1


def test_streaming_events_build_the_same_message(served):
    _, client = session(served)
    messages = [{"role": "user", "content": "Count from one to five."}]
    whole = client.messages.create(model="m", max_tokens=24, messages=messages, extra_body=GREEDY)
    with client.messages.stream(model="m", max_tokens=24, messages=messages, extra_body=GREEDY) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert streamed.content[0].text == whole.content[0].text
    assert (streamed.stop_reason, streamed.usage.output_tokens) == (
        whole.stop_reason,
        whole.usage.output_tokens,
    )


def test_stop_sequences_say_which_one_stopped(served):
    _, client = session(served)
    reply = client.messages.create(
        model="m",
        max_tokens=48,
        messages=[{"role": "user", "content": "List three colours, one per line."}],
        stop_sequences=["\n"],
        extra_body=GREEDY,
    )
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", "\n")


def test_errors_have_anthropics_shape(served, calculator):
    client = anthropic.Anthropic(base_url=f"{served.url}/sessions/nope", api_key="-", max_retries=0)
    with pytest.raises(anthropic.NotFoundError, match="no open session"):
        client.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    _, client = session(served)
    with pytest.raises(anthropic.BadRequestError, match="tool_choice"):
        client.messages.create(
            model="m",
            max_tokens=4,
            messages=[{"role": "user", "content": "x"}],
            tools=calculator.anthropic,
            tool_choice={"type": "any"},
        )
    with pytest.raises(anthropic.BadRequestError, match="user message takes text and tool_result"):
        client.messages.create(
            model="m",
            max_tokens=4,
            messages=[
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}
            ],
        )
    response = httpx.post(f"{served.url}/v1/messages", json={"messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 400
    assert response.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens is required"},
    }


def test_anthropic_agent_fills_the_sample_from_its_session(served, agent_args):
    from rlsdk import Sample
    from rlsdk.agents.anthropic_agent import anthropic_agent

    async def agent(args, sample, client):
        assert isinstance(client, anthropic.AsyncAnthropic)
        messages = [{"role": "user", "content": sample.prompt}]
        first = await client.messages.create(model="m", max_tokens=8, messages=messages)
        messages += [{"role": "assistant", "content": first.content}, {"role": "user", "content": "Again."}]
        second = await client.messages.create(model="m", max_tokens=8, messages=messages)
        return {"said": second.content[0].text if second.content else ""}

    args = agent_args(served, agent)
    sample = Sample(group_index=0, index=3, prompt="Say hi.")
    sample = served.run(anthropic_agent(args, sample, {"temperature": 0.0, "max_new_tokens": 64}))
    meta = sample.metadata["agent"]
    assert meta["turns"] == 2 and meta["forks"] == [] and meta["tree"]["branches"] == 1
    assert meta["tree"]["trained_turns"] == [[0, 0], [1, 0]]
    sampled = sum(sample.loss_mask)
    assert 0 < sampled <= 16 and len(sample.loss_mask) == sample.response_length
    tree_tokens = [t for i in meta["tree"]["trained"] for t in meta["tree"]["nodes"][i]["tokens"]]
    assert tree_tokens == sample.tokens
