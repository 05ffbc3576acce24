"""The built-in tool-call parsers, the chat-request checks and the session tree (no model needed)."""

from __future__ import annotations

import pytest

from rlsdk.agents import FunctionCall
from rlsdk.agents.completions import ChatRequestError, parse_chat_request
from rlsdk.agents.tool_parsers import format_hermes, format_json, parse_hermes, parse_json

TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]


def test_json_parser_takes_calls_to_known_tools_and_leaves_the_rest_as_content():
    text = 'Let me compute. {"name": "calculator", "arguments": {"expression": "2 + 3"}} {"a": 1}'
    parsed = parse_json(text, TOOLS)
    assert parsed.calls == [FunctionCall("calculator", {"expression": "2 + 3"})]
    assert parsed.content == 'Let me compute.  {"a": 1}'
    assert parse_json('{"name": "unknown", "arguments": {}}', TOOLS).calls == []
    assert parse_json('{"name": "calculator", "arguments": "{\\"expression\\": \\"1\\"}"}', TOOLS).calls == [
        FunctionCall("calculator", {"expression": "1"})
    ]
    assert parse_json('{"name": "calculator", "arguments": {"expression": "1"}}', None).calls == []
    assert parse_json("{broken", TOOLS).content == "{broken"


def test_hermes_parser_reads_tool_call_blocks_even_an_unclosed_last_one():
    text = 'Sure.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "4"}}\n</tool_call>\n<tool_call>{"name": "x", "arguments": {}}'
    parsed = parse_hermes(text, TOOLS)
    assert parsed.content == "Sure."
    assert parsed.calls == [FunctionCall("calculator", {"expression": "4"}), FunctionCall("x", {})]
    assert parse_hermes("<tool_call>not json</tool_call>", TOOLS).calls == []
    assert parse_hermes("plain", TOOLS).content == "plain"


@pytest.mark.parametrize(("fmt", "parse"), [(format_json, parse_json), (format_hermes, parse_hermes)])
def test_formatted_calls_parse_back(fmt, parse):
    calls = [FunctionCall("calculator", {"expression": "7 * 6"})]
    assert parse(fmt(calls), TOOLS).calls == calls


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "messages must be a non-empty list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "only text parts"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "not supported"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 0}, "n must be"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature must be"),
        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}, "top_logprobs"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools must be"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": 3}}],
                    }
                ]
            },
            "must be a JSON object or its text",
        ),
    ],
)
def test_bad_requests_say_what_is_wrong(body, message):
    with pytest.raises(ChatRequestError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_chat_request(body)


def test_messages_compare_as_the_model_sees_them():
    """An assistant message sent back as the openai client serialises it (extra keys, ids, arguments as
    text with other spacing) equals the one the server returned."""
    returned = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
        ],
    }
    sent_back = {
        "role": "assistant",
        "content": "",
        "refusal": None,
        "annotations": None,
        "tool_calls": [
            {"id": "call_other", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
        ],
    }
    one = parse_chat_request({"messages": [returned]}).messages
    other = parse_chat_request({"messages": [sent_back]}).messages
    assert (
        one
        == other
        == [{"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": {"a": 1}}]}]
    )


@pytest.mark.parametrize("name", ["json", "hermes"])
def test_core_parsers_pass_the_plugin_kit(rlsdk_pm, name):
    """Core registers its parsers itself: the kit finds them in a manager without plugin packages."""
    from rlsdk.testing import check_tool_call_parser

    assert check_tool_call_parser(rlsdk_pm, name).info.module == "rlsdk.agents.plugin"


def test_the_session_store_is_bounded():
    from rlsdk.agents.sessions import SessionStore

    store = SessionStore(max_sessions=2)
    first, _ = store.open(), store.open()
    with pytest.raises(OverflowError, match="2 sessions are open"):
        store.open()
    store.close(first.id)
    assert store.open().id != first.id and len(store) == 2


def test_the_message_tree_reuses_ids_and_records_forks():
    from rlsdk.agents.sessions import Choice, Session

    session = Session("s")
    user = [
        {
            "role": "user",
            "content": "q",
        }
    ]
    answer = {"role": "assistant", "content": "a"}
    first = session.record_turn(user, None, [1, 2, 3], session.plan(user, None))
    first.choices = [Choice(answer, [4, 5], [-0.1, -0.2], "stop", "0")]
    follow_up = [*user, answer, {"role": "user", "content": "more"}]
    plan = session.plan(follow_up, None)
    assert (plan.parent, plan.fork, plan.new_messages) == ((0, 0), None, follow_up[2:])
    assert session.recorded_ids((0, 0))[1] == [1, 2, 3, 4, 5]
    second = session.record_turn(follow_up, None, [1, 2, 3, 4, 5, 6, 7], plan)
    second.choices = [Choice({"role": "assistant", "content": "b"}, [8], [-0.3], "length", "1")]
    assert second.reused == 5 and session.response_tokens(second.prompt_ids, (0, 0)) == 4
    # a new system prompt extends no recorded turn: a new root, forked at message 0
    plan = session.plan([{"role": "system", "content": "be brief"}, *user], None)
    assert plan.parent is None and plan.fork == {"reason": "new_root", "diverged_at": 0, "sibling": 0}
    trajectory = session.trajectory()
    assert trajectory.turns == [(0, 0), (1, 0)] and trajectory.finish_reason == "length"
    assert (trajectory.tokens, trajectory.prompt_length) == ([1, 2, 3, 4, 5, 6, 7, 8], 3)
    assert trajectory.loss_mask == [1, 1, 0, 0, 1] and trajectory.rollout_log_probs == [
        -0.1,
        -0.2,
        0.0,
        0.0,
        -0.3,
    ]
    assert trajectory.weight_versions == ["0", "1"]
