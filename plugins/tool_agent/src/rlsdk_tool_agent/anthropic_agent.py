"""``tool_agent_anthropic``: the tool agent written against the ``anthropic`` client only (the Messages API:
a system prompt, ``tool_use`` blocks, ``tool_result`` blocks sent back), for ``--custom-generate
anthropic_agent``. The same tools and worked examples as :mod:`.agent`, in Anthropic's shapes."""

from __future__ import annotations

import json
from typing import Any

from .agent import EXAMPLES, SYSTEM, TOOLS, question, run_tool

ANTHROPIC_TOOLS: list[dict[str, Any]] = [
    {
        "name": tool["function"]["name"],
        "description": tool["function"]["description"],
        "input_schema": tool["function"]["parameters"],
    }
    for tool in TOOLS
    if isinstance(tool["function"], dict)
]


def _example_messages() -> list[dict[str, Any]]:
    """The worked examples as Anthropic messages: calls as tool_use blocks, results as tool_result."""
    messages: list[dict[str, Any]] = []
    for message in EXAMPLES:
        if message["role"] == "assistant" and message.get("tool_calls"):
            blocks = [
                {
                    "type": "tool_use",
                    "id": call["id"],
                    "name": call["function"]["name"],
                    "input": json.loads(call["function"]["arguments"]),
                }
                for call in message["tool_calls"]
            ]
            messages.append({"role": "assistant", "content": blocks})
        elif message["role"] == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": message["tool_call_id"],
                "content": message["content"],
            }
            messages.append({"role": "user", "content": [result]})
        else:
            messages.append({"role": message["role"], "content": message["content"]})
    return messages


async def tool_agent_anthropic(args: Any, sample: Any, client: Any) -> dict[str, Any]:
    """Answer ``sample``'s question with the calculator and search tools through ``client.messages``;
    returns the final answer (None when the turns ran out) and the number of tool calls."""
    messages = [*_example_messages(), {"role": "user", "content": question(sample)}]
    calls = 0
    for _ in range(args.max_turns):
        reply = await client.messages.create(
            model="policy", system=SYSTEM, messages=messages, tools=ANTHROPIC_TOOLS, max_tokens=256
        )
        messages.append({"role": "assistant", "content": reply.content})  # sent back as the client made it
        uses = [block for block in reply.content if block.type == "tool_use"]
        if not uses or reply.stop_reason == "max_tokens":
            text = "".join(block.text for block in reply.content if block.type == "text")
            return {"answer": text, "tool_calls": calls}
        results = []
        for block in uses:
            calls += 1
            arguments = block.input if "INVALID_JSON" not in block.input else {}
            results.append(
                {"type": "tool_result", "tool_use_id": block.id, "content": run_tool(block.name, arguments)}
            )
        messages.append({"role": "user", "content": results})
    return {"answer": None, "tool_calls": calls}
