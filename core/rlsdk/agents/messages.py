"""``/v1/messages``, Anthropic's Messages API, on the same turns as ``/v1/chat/completions``: a request is
converted to the one internal :class:`~.completions.ChatRequest` (canonical messages: the system prompt
first, ``tool_result`` blocks as tool messages, ``tool_use`` blocks as tool calls), answered and recorded
by :class:`~.completions.ChatEndpoint`, and shaped as Anthropic's message or its stream of events.

A tool call whose arguments the model wrote as no JSON object comes back as
``{"type": "tool_use", "input": {"INVALID_JSON": "<the text>"}}`` (Anthropic's own convention) and is read
back as that text, so the session still matches the turn and reuses its sampled tokens."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncGenerator
from typing import Any

from .chat_template import canonical_call
from .completions import (
    MAX_STOPS,
    Answer,
    ChatEndpoint,
    ChatRequest,
    ChatRequestError,
    Finished,
    TextDelta,
    Turned,
    check_int,
    check_number,
    check_tool_schema,
    check_typed,
)
from .sessions import Session

INVALID_JSON = "INVALID_JSON"
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def parse_messages_request(body: dict[str, Any]) -> ChatRequest:
    """Check a ``/v1/messages`` body and convert it; anything malformed or unsupported raises
    :class:`~.completions.ChatRequestError`."""
    try:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        canonical = _system(body.get("system"))
        for i, message in enumerate(messages):
            canonical += _canonical(message, f"messages[{i}]")
        tools = _tools(body.get("tools"))
        choice = body.get("tool_choice") or {"type": "auto"}
        if not isinstance(choice, dict) or choice.get("type") not in ("auto", "none"):
            raise ValueError(
                f"tool_choice {choice!r:.80} is not supported (no constrained decoding): "
                "use {'type': 'auto'} or {'type': 'none'}"
            )
        stop = body.get("stop_sequences") or []
        if (
            not isinstance(stop, list)
            or len(stop) > MAX_STOPS
            or not all(isinstance(s, str) and s for s in stop)
        ):
            raise ValueError(f"stop_sequences must be a list of at most {MAX_STOPS} non-empty strings")
        thinking = body.get("thinking")
        if isinstance(thinking, dict) and thinking.get("type") == "enabled":
            raise ValueError("thinking is not supported: the model's reasoning comes back as its text")
        max_tokens = check_int(body, "max_tokens", None, 1, None)
        if max_tokens is None:
            raise ValueError("max_tokens is required")
        return ChatRequest(
            model=check_typed(body, "model", str, "") or "",
            messages=canonical,
            tools=tools,
            parse_tools=bool(tools) and choice["type"] == "auto",
            n=1,
            stream=bool(check_typed(body, "stream", bool, False)),
            include_usage=True,
            stop=list(stop),
            max_tokens=max_tokens,
            temperature=check_number(body, "temperature", 0.0, 1.0),
            top_p=check_number(body, "top_p", 0.0, 1.0),
            seed=None,
            logprobs=False,
            top_k=check_int(body, "top_k", None, 1, None),
        )
    except (ValueError, TypeError) as exc:
        raise ChatRequestError(str(exc)) from None


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None or system == "":
        return []
    if isinstance(system, list):
        system = _texts(system, "system")
    if not isinstance(system, str):
        raise TypeError("system must be a string or a list of text blocks")
    return [{"role": "system", "content": system}]


def _texts(blocks: list[Any], where: str) -> str:
    if not all(
        isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str) for b in blocks
    ):
        raise ValueError(f"{where}: only text blocks are supported here, got {str(blocks)[:80]!r}")
    return "".join(b["text"] for b in blocks)


def _canonical(message: Any, where: str) -> list[dict[str, Any]]:
    """One Anthropic message as canonical messages: an assistant turn (its text, then its tool calls), or
    a user turn's tool results (one tool message each, in order) and text."""
    if not isinstance(message, dict):
        raise TypeError(f"{where} must be an object, got {type(message).__name__}")
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise ValueError(f"{where}.role must be user or assistant, got {role!r:.40}")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise TypeError(f"{where}.content must be a string or a list of content blocks")
    if role == "assistant":
        texts, calls = [], []
        for k, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "tool_use" and isinstance(block.get("name"), str):
                calls.append(_tool_use(block, f"{where}.content[{k}]"))
            else:
                raise ValueError(f"{where}.content[{k}]: an assistant message takes text and tool_use blocks")
        out: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
        if calls:
            out["tool_calls"] = calls
        return [out]
    converted: list[tuple[str, list[str]]] = []  # (role, texts): joined once, not block by block
    for k, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            result = block.get("content", "")
            text = _texts(result, f"{where}.content[{k}].content") if isinstance(result, list) else result
            if not isinstance(text, str):
                raise TypeError(f"{where}.content[{k}].content must be a string or a list of text blocks")
            converted.append(("tool", [text]))
        elif kind == "text" and isinstance(block.get("text"), str):
            if converted and converted[-1][0] == "user":
                converted[-1][1].append(block["text"])
            else:
                converted.append(("user", [block["text"]]))
        else:
            raise ValueError(f"{where}.content[{k}]: a user message takes text and tool_result blocks")
    return [{"role": role, "content": "".join(texts)} for role, texts in converted]


def _tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    arguments = block.get("input", {})
    if (
        isinstance(arguments, dict)
        and set(arguments) == {INVALID_JSON}
        and isinstance(arguments[INVALID_JSON], str)
    ):
        arguments = arguments[INVALID_JSON]
    elif not isinstance(arguments, dict):
        raise TypeError(f"{where}.input must be an object")
    return canonical_call(block["name"], arguments, f"{where}.input")


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    """Anthropic's tool definitions as function tools, the one shape templates and parsers take."""
    if not tools:
        return None
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and isinstance(t.get("name"), str) and t.get("type") in (None, "custom")
        for t in tools
    ):
        raise ValueError("tools must be a list of {'name': ..., 'description': ..., 'input_schema': {...}}")
    for i, tool in enumerate(tools):
        check_tool_schema(tool.get("input_schema"), f"tools[{i}].input_schema")
    return [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description", ""),
                "parameters": t.get("input_schema") or {"type": "object", "properties": {}},
            },
        }
        for t in tools
    ]


# ------------------------------------------------------------------------------------- answering


async def create_message(chat: ChatEndpoint, request: ChatRequest, session: Session | None) -> dict[str, Any]:
    """The ``message`` body for ``request``."""
    turned = await chat.turn(request, session)
    answer = turned.answers[0]
    body = _message(chat, _blocks(answer), answer)
    body["usage"] = _usage(turned)
    return body


async def stream_message(
    chat: ChatEndpoint, request: ChatRequest, session: Session | None
) -> AsyncGenerator[tuple[str, dict[str, Any]]]:
    """(event name, data) pairs as Anthropic streams them: ``message_start``, a text block as it comes
    (opened at its first text), each tool_use block whole, ``message_delta`` with the stop reason and the
    output tokens, ``message_stop``."""
    index = 0
    text_open = False
    async for event in chat.events(request, session):
        if isinstance(event, Turned):
            if not event.answers:
                start = _message(chat, [], None)
                start["usage"] = {"input_tokens": len(event.prompt_ids), "output_tokens": 0}
                yield "message_start", {"type": "message_start", "message": start}
            continue
        text = event.text if isinstance(event, TextDelta) else event.rest
        if text:
            if not text_open:
                text_open = True
                block = {"type": "text", "text": ""}
                yield (
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": block},
                )
            delta = {"type": "text_delta", "text": text}
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        if not isinstance(event, Finished):
            continue
        if text_open:
            yield "content_block_stop", {"type": "content_block_stop", "index": index}
            index += 1
        for block in _blocks(event.answer):
            if block["type"] != "tool_use":  # the text went out as it came
                continue
            start = {**block, "input": {}}
            partial = json.dumps(block["input"], ensure_ascii=False)
            delta = {"type": "input_json_delta", "partial_json": partial}
            yield (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
            yield "content_block_stop", {"type": "content_block_stop", "index": index}
            index += 1
        stop = _stop(event.answer)
        output = {"output_tokens": len(event.answer.choice.output_ids)}
        yield "message_delta", {"type": "message_delta", "delta": stop, "usage": output}
        yield "message_stop", {"type": "message_stop"}


def _blocks(answer: Answer) -> list[dict[str, Any]]:
    """The answer's content blocks: its text (when there is any), then a tool_use block per call."""
    blocks: list[dict[str, Any]] = []
    if answer.parsed.content:
        blocks.append({"type": "text", "text": answer.parsed.content})
    for call in answer.parsed.calls:
        arguments = {INVALID_JSON: call.arguments} if isinstance(call.arguments, str) else call.arguments
        blocks.append(
            {
                "type": "tool_use",
                "id": f"toolu_{secrets.token_hex(12)}",
                "name": call.name,
                "input": arguments,
            }
        )
    return blocks


def _message(chat: ChatEndpoint, content: list[dict[str, Any]], answer: Answer | None) -> dict[str, Any]:
    stop = _stop(answer) if answer is not None else {"stop_reason": None, "stop_sequence": None}
    return {
        "id": f"msg_{secrets.token_hex(12)}",
        "type": "message",
        "role": "assistant",
        "model": chat.model_id,
        "content": content,
        **stop,
    }


def _stop(answer: Answer) -> dict[str, Any]:
    if answer.stop_sequence is not None:
        return {"stop_reason": "stop_sequence", "stop_sequence": answer.stop_sequence}
    return {"stop_reason": STOP_REASONS[answer.choice.finish_reason], "stop_sequence": None}


def _usage(turned: Turned) -> dict[str, int]:
    prompt, sampled = turned.usage
    return {"input_tokens": prompt, "output_tokens": sampled}


def anthropic_error_body(message: str, status: int) -> dict[str, Any]:
    """Anthropic's error body."""
    kinds = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        503: "overloaded_error",
    }
    return {"type": "error", "error": {"type": kinds.get(status, "api_error"), "message": message}}
