"""The built-in tool-call parsers: ``json`` (a bare JSON object per call, a convention small models such as
SmolLM2-135M-Instruct follow from a system message) and ``hermes`` (``<tool_call>{...}</tool_call>``, the
format of Hermes and Qwen chat templates)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..plugins.records import ToolCallParser


@dataclass
class FunctionCall:
    """One call of a tool: its name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass
class ParsedTurn:
    """A model turn split into the text for the user and the calls it makes."""

    content: str
    calls: list[FunctionCall] = field(default_factory=list)


def tool_names(tools: list[dict[str, Any]] | None) -> set[str]:
    """The function names of OpenAI tool definitions."""
    functions = [tool.get("function") or {} for tool in tools or [] if isinstance(tool, dict)]
    return {function["name"] for function in functions if isinstance(function.get("name"), str)}


def _arguments(value: Any) -> dict[str, Any] | None:
    """A call's arguments as a dict: an object, or the JSON text of one; None when neither."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, dict) else None


def _as_call(value: Any) -> FunctionCall | None:
    """``{"name": ..., "arguments": {...}}`` (or ``parameters``, or arguments as JSON text) as a call."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = _arguments(value.get("arguments", value.get("parameters", {})))
    return None if arguments is None else FunctionCall(value["name"], arguments)


def _call_json(call: FunctionCall) -> str:
    return json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)


def _tool_lines(tools: list[dict[str, Any]]) -> str:
    return "\n".join(json.dumps(tool.get("function", tool), ensure_ascii=False) for tool in tools)


# ---------------------------------------------------------------------------- json


def parse_json(text: str, tools: list[dict[str, Any]] | None) -> ParsedTurn:
    """Every JSON object in ``text`` whose ``name`` is one of the tools is a call (arguments under
    ``arguments`` or ``parameters``, an object or its JSON text); the rest of the text is the content."""
    names = tool_names(tools)
    decoder = json.JSONDecoder()
    calls, kept, position = [], [], 0
    start = text.find("{") if names else -1
    while start != -1:
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        call = _as_call(value)
        if call is not None and call.name in names:
            calls.append(call)
            kept.append(text[position:start])
            position = end
        start = text.find("{", end)
    if not calls:
        return ParsedTurn(text)
    return ParsedTurn("".join([*kept, text[position:]]).strip(), calls)


def format_json(calls: list[FunctionCall]) -> str:
    return "\n".join(_call_json(call) for call in calls)


def json_tools_prompt(tools: list[dict[str, Any]]) -> str:
    lines = []
    for tool in tools:
        function = tool.get("function", tool)
        properties = (function.get("parameters") or {}).get("properties") or {}
        arguments = ", ".join(f'"{name}": {spec.get("type", "value")}' for name, spec in properties.items())
        lines.append(f"- {function['name']}: {function.get('description', '')} Arguments: {{{arguments}}}")
    example = tools[0].get("function", tools[0])["name"]
    return (
        "You can use these tools:\n" + "\n".join(lines) + "\nTo use a tool, reply with only a JSON object "
        f'like {{"name": "{example}", "arguments": {{...}}}}. When you know the answer, reply with the '
        "answer."
    )


# ---------------------------------------------------------------------------- hermes

_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_hermes(text: str, tools: list[dict[str, Any]] | None) -> ParsedTurn:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (the last one may be left open
    when the turn ended on its end-of-turn token); the text before the first block is the content. A turn
    with a block that is not a call object is all content."""
    first = text.find("<tool_call>")
    if first == -1:
        return ParsedTurn(text)
    calls = []
    for match in _HERMES_CALL.finditer(text, first):
        try:
            call = _as_call(json.loads(match.group(1)))
        except json.JSONDecodeError:
            call = None
        if call is None:
            return ParsedTurn(text)
        calls.append(call)
    return ParsedTurn(text[:first].strip(), calls)


def format_hermes(calls: list[FunctionCall]) -> str:
    return "\n".join(f"<tool_call>\n{_call_json(call)}\n</tool_call>" for call in calls)


def hermes_tools_prompt(tools: list[dict[str, Any]]) -> str:
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
        f"with function signatures within <tools></tools> XML tags:\n<tools>\n{_tool_lines(tools)}\n</tools>"
        "\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def builtin_parsers() -> list[ToolCallParser]:
    """Core's tool-call parsers, ``json`` and ``hermes`` (registered by :mod:`rlsdk.agents.plugin`)."""
    return [
        ToolCallParser(
            name="json",
            func=parse_json,
            marker="{",
            format_calls=format_json,
            tools_prompt=json_tools_prompt,
            description='A JSON object {"name": ..., "arguments": {...}} per call (small models)',
        ),
        ToolCallParser(
            name="hermes",
            func=parse_hermes,
            marker="<tool_call>",
            format_calls=format_hermes,
            tools_prompt=hermes_tools_prompt,
            description="<tool_call>{...}</tool_call> blocks (Hermes and Qwen chat templates)",
        ),
    ]
