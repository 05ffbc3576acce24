"""The agent endpoint's session JSON and turn rules as docs/agent-endpoint.md and docs/agents.md state them
(issue 56), on a FakeEngine with rlsdk.testing.ChatTokenizer served on loopback (a fake engine: the shapes, not
a model's answers, are under test)."""

from __future__ import annotations

import httpx

from rlsdk.testing import ChatTokenizer, FakeEngine, ServedEngine

TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "properties": {}}}}]


def test_a_sessions_record_has_the_documented_shapes():
    replies = ["Hi.<|im_end|>", "Sure.<|im_end|>", "Again.<|im_end|>"]
    with ServedEngine(FakeEngine(replies, ChatTokenizer())) as served:
        opened = httpx.post(served.url + "/sessions", timeout=30).json()
        assert set(opened) == {"id"}
        chat = f"{served.url}/sessions/{opened['id']}/v1/chat/completions"
        first = [{"role": "user", "content": "hello"}]
        reply = httpx.post(chat, json={"model": "m", "messages": first}, timeout=30).json()
        follow = [*first, reply["choices"][0]["message"], {"role": "user", "content": "more"}]
        httpx.post(chat, json={"model": "m", "messages": follow}, timeout=30).raise_for_status()
        httpx.post(chat, json={"model": "m", "messages": first, "tools": TOOLS}, timeout=30).raise_for_status()
        record = httpx.get(f"{served.url}/sessions/{opened['id']}", timeout=30).json()
    assert set(record) == {"id", "turns", "forks", "tree", "trajectory"}
    root, second, third = record["turns"]
    assert set(second) == {"index", "messages", "tools", "prompt_ids", "parent", "reused", "fork", "choices", "error"}
    assert set(second["choices"][0]) == {
        "message", "output_ids", "logprobs", "finish_reason", "weight_version", "malformed_calls"
    }
    assert root["parent"] is None and second["parent"] == [0, 0] and second["reused"] > 0 and second["fork"] is None
    assert third["fork"]["reason"] == "new_root"  # other tools: nothing recorded matches
    assert record["forks"] == [{"turn": 2, **third["fork"]}]
    assert set(record["trajectory"]) == {
        "tokens", "prompt_length", "loss_mask", "rollout_log_probs", "turns", "finish_reason", "weight_versions"
    }
    assert record["tree"]["format"] == "rlsdk.trajectory_tree/1"
    assert set(record["tree"]["nodes"][0]) == {"id", "parent", "tokens", "loss_mask", "logprobs", "ends"}


def test_a_call_of_a_tool_not_in_tools_is_plain_text_and_is_error_is_accepted():
    call = '{"name": "nope", "arguments": {}}<|im_end|>'
    with ServedEngine(FakeEngine([call, call], ChatTokenizer())) as served:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": TOOLS}
        message = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=30).json()["choices"][0]
        assert message["message"]["content"].startswith('{"name": "nope"') and not message["message"].get("tool_calls")
        turn = [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "calc", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "boom", "is_error": True}]},
        ]
        tools = [{"name": "calc", "input_schema": {"type": "object", "properties": {}}}]
        answer = httpx.post(
            served.url + "/v1/messages", json={"model": "m", "max_tokens": 32, "messages": turn, "tools": tools},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["content"][0]["type"] == "text"  # a call of an unknown tool: text


def test_the_sessions_budget_caps_max_tokens():
    """A session's response budget (a run's --rollout-max-response-len) wins over a larger max_tokens."""
    seen = []

    def respond(payload, call):
        seen.append(payload["sampling_params"]["max_new_tokens"])
        return "ok<|im_end|>"

    with ServedEngine(FakeEngine(respond, ChatTokenizer())) as served:
        session = served.handle.chat.sessions.open(max_response_tokens=7)
        chat = f"{served.url}/sessions/{session.id}/v1/chat/completions"
        for asked in (100, 3):
            body = {"model": "m", "messages": [{"role": "user", "content": f"{asked}"}], "max_tokens": asked}
            httpx.post(chat, json=body, timeout=30).raise_for_status()
    assert seen == [7, 3]
