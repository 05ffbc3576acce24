"""Reading tool calls out of a model turn: tag style (``<search>query</search>``) and the JSON style
of chat templates with ``tools`` (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from rlsdk import Tool

_JSON_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass
class ToolCall:
    """One call found in a turn; ``error`` says why it cannot run (bad JSON, unknown tool, ...)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    style: str = "tag"
    position: int = 0
    error: str | None = None


def tag_calls(text: str, tools: dict[str, Tool]) -> list[ToolCall]:
    """``<name>text</name>`` for each tool; the text fills the tool's single parameter (or is JSON)."""
    calls = []
    for name, tool in tools.items():
        for match in re.finditer(rf"<{re.escape(name)}>(.*?)</{re.escape(name)}>", text, re.DOTALL):
            body = match.group(1).strip()
            call = ToolCall(name, style="tag", position=match.start())
            if tool.tag_argument:
                call.arguments = {tool.tag_argument: body}
            else:
                call.arguments, call.error = _json_object(body, f"<{name}> needs JSON arguments")
            calls.append(call)
    return calls


def json_calls(text: str, tools: dict[str, Tool]) -> list[ToolCall]:
    """``<tool_call>{...}</tool_call>`` blocks, or a turn that is one bare JSON call object."""
    blocks = [(m.group(1), m.start()) for m in _JSON_CALL.finditer(text)]
    if not blocks and text.strip().startswith("{") and '"name"' in text:
        blocks = [(text.strip(), 0)]
    calls = []
    for body, position in blocks:
        data, error = _json_object(body, "a tool call must be a JSON object")
        name = str(data.get("name", "")) if not error else ""
        arguments = data.get("arguments", data.get("parameters", {})) if not error else {}
        if isinstance(arguments, str):
            arguments, error = _json_object(arguments, "tool call arguments must be a JSON object")
        if not error and not name:
            error = 'a tool call needs a "name"'
        if not error and name not in tools:
            error = f"unknown tool {name!r}; available: {', '.join(sorted(tools)) or 'none'}"
        calls.append(ToolCall(name, arguments if not error else {}, "json", position, error))
    return calls


def parse_tool_calls(text: str, tools: dict[str, Tool], style: str = "auto") -> list[ToolCall]:
    """The tool calls of one model turn in order of appearance; ``style`` is tag, json or auto."""
    calls = []
    if style in ("tag", "auto"):
        calls += tag_calls(text, tools)
    if style in ("json", "auto"):
        calls += json_calls(text, tools)
    return sorted(calls, key=lambda c: c.position)


def _json_object(text: str, message: str) -> tuple[dict[str, Any], str | None]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return {}, f"{message}: {exc}"
    if not isinstance(value, dict):
        return {}, message
    return value, None
