"""The built-in tool-call parsers: ``json`` (a bare JSON object per call, a convention small models such as
SmolLM2-135M-Instruct follow from a system message, and Llama 3's ``{"name": ..., "parameters": ...}``) and
``hermes`` (``<tool_call>{...}</tool_call>``, the format of Hermes and Qwen chat templates).

A call whose arguments are no JSON object (the model wrote them broken) keeps them as the text it wrote:
the client gets that text, and the session its sampled tokens, never a re-serialised version."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..plugins.kinds import ToolCallParser


@dataclass
class FunctionCall:
    """One call of a tool: its name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    """The arguments object, or the text the model wrote for it when that is no JSON object."""


@dataclass
class ParsedTurn:
    """A model turn split into the text for the user and the calls it makes (in the order written);
    ``malformed`` counts call attempts too broken to name a tool (they stay in the content)."""

    content: str
    calls: list[FunctionCall] = field(default_factory=list)
    malformed: int = 0


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
    """``{"name": ..., "arguments": {...}}`` (or ``parameters``, or arguments as JSON text) as a call;
    arguments that are no object are kept as text."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    raw = value.get("arguments", value.get("parameters", {}))
    arguments = _arguments(raw)
    if arguments is not None:
        return FunctionCall(value["name"], arguments)
    return FunctionCall(value["name"], raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False))


_BROKEN_CALL = re.compile(
    r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)+)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(.*)', re.DOTALL
)


def _broken_call(text: str) -> FunctionCall | None:
    """A call object that is no JSON (``{"name": "f", "arguments": {"x": 1}`` cut short, say): its name, and
    the text after ``"arguments":`` as written, less the brace that closes the call; None without a name."""
    match = _BROKEN_CALL.match(text.strip())
    if match is None:
        return None
    raw = match.group(2).rstrip()
    if raw.endswith("}") and raw.count("}") > raw.count("{"):
        raw = raw[:-1].rstrip()
    arguments = _arguments(raw)
    return FunctionCall(json.loads(f'"{match.group(1)}"'), raw if arguments is None else arguments)


def _call_json(call: FunctionCall) -> str:
    if isinstance(call.arguments, str):  # written back as the model wrote it
        return f'{{"name": {json.dumps(call.name, ensure_ascii=False)}, "arguments": {call.arguments}}}'
    return json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)


def _tool_lines(tools: list[dict[str, Any]]) -> str:
    return "\n".join(json.dumps(tool.get("function", tool), ensure_ascii=False) for tool in tools)


# ---------------------------------------------------------------------------- json


def parse_json(text: str, tools: list[dict[str, Any]] | None) -> ParsedTurn:
    """Every JSON object in ``text`` whose ``name`` is one of the tools is a call (arguments under
    ``arguments`` or ``parameters``, an object or its JSON text); the rest of the text is the content. A
    call to a tool that is no JSON runs to the end of its line, its arguments kept as written."""
    names = tool_names(tools)
    decoder = json.JSONDecoder()
    calls, kept, position = [], [], 0
    start = text.find("{") if names else -1
    while start != -1:
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            end = text.find("\n", start)
            end = len(text) if end == -1 else end
            broken = _broken_call(text[start:end])
            if broken is not None and broken.name in names:
                calls.append(broken)
                kept.append(text[position:start])
                position = end
                start = text.find("{", end)
            else:
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
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        arguments = ", ".join(
            f'"{name}": {spec.get("type", "value") if isinstance(spec, dict) else "value"}'  # a schema may be a bool
            for name, spec in (properties if isinstance(properties, dict) else {}).items()
        )
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
    when the turn ended on its end-of-turn token); the text before the first block is the content. A block
    that is no JSON but names a tool is a call with its arguments as written; a turn with a block that
    names none is all content."""
    first = text.find("<tool_call>")
    if first == -1:
        return ParsedTurn(text)
    calls = []
    for match in _HERMES_CALL.finditer(text, first):
        try:
            call = _as_call(json.loads(match.group(1)))
        except json.JSONDecodeError:
            call = _broken_call(match.group(1))
        if call is None:
            return ParsedTurn(text, malformed=1)
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


# ---------------------------------------------------------------------------- mistral


def parse_mistral(text: str, tools: list[dict[str, Any]] | None) -> ParsedTurn:
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (Mistral's format; ``[TOOL_CALLS]`` is a
    control token, gone from text decoded without special tokens, so the array alone also counts): the
    calls in order, the text before them the content. An array that is no JSON but starts with a call to a
    tool is one call with its arguments as written."""
    names = tool_names(tools)
    start = text.find("[TOOL_CALLS]")
    body = text[start + len("[TOOL_CALLS]") :] if start != -1 else text
    opening = body.find("[")
    if not names or opening == -1 or (start == -1 and not body[opening:].lstrip("[ \n").startswith("{")):
        return ParsedTurn(text)
    content = (text[:start] if start != -1 else body[:opening]).strip()
    try:
        values, _ = json.JSONDecoder().raw_decode(body, opening)
    except json.JSONDecodeError:
        broken = _broken_call(body[opening + 1 :].strip().removesuffix("]"))
        if broken is None or broken.name not in names:
            return ParsedTurn(text, malformed=int(start != -1))
        return ParsedTurn(content, [broken])
    calls = [_as_call(value) for value in values] if isinstance(values, list) else []
    if not calls or any(call is None or call.name not in names for call in calls):
        return ParsedTurn(text)
    return ParsedTurn(content, [call for call in calls if call is not None])


def format_mistral(calls: list[FunctionCall]) -> str:
    return "[TOOL_CALLS][" + ", ".join(_call_json(call) for call in calls) + "]"


def mistral_tools_prompt(tools: list[dict[str, Any]]) -> str:
    return f"[AVAILABLE_TOOLS]{json.dumps(tools, ensure_ascii=False)}[/AVAILABLE_TOOLS]"


def builtin_parsers() -> list[ToolCallParser]:
    """Core's tool-call parsers, ``json``, ``hermes`` and ``mistral`` (registered by :mod:`rlsdk.agents.plugin`)."""
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
        ToolCallParser(
            name="mistral",
            func=parse_mistral,
            marker="[",
            format_calls=format_mistral,
            tools_prompt=mistral_tools_prompt,
            description="[TOOL_CALLS][{...}, ...]: a JSON array of calls (Mistral chat templates)",
        ),
    ]
