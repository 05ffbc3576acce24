"""``tool_agent``: a tool-using agent written against the ``openai`` client only. It asks the model,
runs the calculator and search tools the model calls, sends the results back, and stops at an answer
without a call or after ``args.max_turns`` model turns. Nothing in it knows about rlsdk's tokens."""

from __future__ import annotations

import json
from typing import Any

from rlsdk_generators.calculator import calculator

from .notes import search

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the local notes for a fact.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    },
]
SYSTEM = "Answer the question. Use a tool when it helps."


def _call(call_id: str, name: str, arguments: dict[str, str]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


EXAMPLES: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 12 * 3?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [_call("ex1", "calculator", {"expression": "12 * 3"})],
    },
    {"role": "tool", "tool_call_id": "ex1", "content": "36"},
    {"role": "assistant", "content": "The answer is 36."},
    {"role": "user", "content": "Who wrote the notes about the river Elm?"},
    {"role": "assistant", "content": None, "tool_calls": [_call("ex2", "search", {"query": "river Elm"})]},
    {"role": "tool", "tool_call_id": "ex2", "content": "The river Elm notes were written by Ada Brook."},
    {"role": "assistant", "content": "The answer is Ada Brook."},
]
"""Worked examples: a 135M model follows the tool-call convention after seeing it used."""


def run_tool(name: str, arguments: dict[str, Any]) -> str:
    """A tool's observation; a failing or unknown tool gives the model an error to read, not a crash."""
    try:
        if name == "calculator":
            return calculator(None, str(arguments.get("expression", "")))
        if name == "search":
            return search(str(arguments.get("query", "")))
        return f"Error: no tool named {name!r}"
    except (ValueError, SyntaxError, ZeroDivisionError, TypeError, OverflowError) as exc:
        return f"Error: {exc}"


def question(sample: Any) -> str:
    """The sample's question: its prompt, or the last user message of a chat prompt."""
    if isinstance(sample.prompt, str):
        return sample.prompt
    return next(m["content"] for m in reversed(sample.prompt) if m.get("role") == "user")


async def tool_agent(args: Any, sample: Any, client: Any) -> dict[str, Any]:
    """Answer ``sample``'s question with the calculator and search tools; returns the final answer
    (None when the turns ran out) and the number of tool calls."""
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        *EXAMPLES,
        {"role": "user", "content": question(sample)},
    ]
    calls = 0
    for _ in range(args.max_turns):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message)  # sent back as the client serialises it
        if not message.tool_calls or reply.choices[0].finish_reason == "length":
            return {"answer": message.content, "tool_calls": calls}
        for call in message.tool_calls:
            calls += 1
            try:
                arguments = json.loads(call.function.arguments)
            except json.JSONDecodeError:
                arguments = {}
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": run_tool(call.function.name, arguments)}
            )
    return {"answer": None, "tool_calls": calls}
