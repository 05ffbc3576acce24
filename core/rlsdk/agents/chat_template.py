"""Chat messages to token ids through the tokenizer's chat template, and the ids that continue a recorded
turn: the messages after it, rendered on their own, so that earlier turns are never re-tokenised."""

from __future__ import annotations

import copy
import json
from typing import Any

from ..plugins.kinds import ToolCallParser
from .tool_parsers import FunctionCall

_MARKER = "\u2063rlsdk-turn\u2063"
"""Stands in for a recorded assistant turn, so the text the template puts after it can be cut out."""


class ChatTemplate:
    """Renders conversations with ``tokenizer``'s chat template. Templates that render no tools (or no
    assistant tool calls) get them from the tool-call ``parser``: tool definitions in the system message,
    calls written into the assistant's content."""

    def __init__(self, tokenizer: Any, parser: ToolCallParser, template_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.parser = parser
        self.template_kwargs = template_kwargs or {}
        source = str(getattr(tokenizer, "chat_template", None) or "")
        self.renders_tools = "tools" in source
        self.renders_calls = "tool_calls" in source
        self.special_ids = set(getattr(tokenizer, "all_special_ids", ()))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
    ) -> str:
        messages = [self._template_message(m) for m in messages]
        if tools and not self.renders_tools:
            if self.parser.tools_prompt is None:
                raise ValueError(
                    f"the chat template renders no tools and tool_call_parser {self.parser.name!r} "
                    "has no tools_prompt to describe them"
                )
            text = self.parser.tools_prompt(tools)
            if messages and messages[0]["role"] == "system":
                messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}
            else:
                messages.insert(0, {"role": "system", "content": text})
        try:
            return self.tokenizer.apply_chat_template(
                messages,
                tools=tools if self.renders_tools and tools else None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **self.template_kwargs,
            )
        except Exception as exc:  # the template runs on what the request sent: its failure is the request's
            raise ValueError(
                f"the chat template cannot render these messages and tools: {type(exc).__name__}: {exc}"
            ) from exc

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """The whole conversation, tokenised at once, up to the next assistant turn."""
        return self.encode(self.render(messages, tools, add_generation_prompt=True))

    def continuation_ids(
        self,
        history: list[dict[str, Any]],
        output_ids: list[int],
        new: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
    ) -> list[int]:
        """The ids after a recorded turn (``history``, then the model's ``output_ids``) up to the next
        assistant turn: the messages ``new``, rendered after a stand-in for the recorded turn. What the
        template closes the turn with is kept unless the model already sampled it (its end-of-turn token)."""
        stand_in = [*history, {"role": "assistant", "content": _MARKER}]
        text = self.render([*stand_in, *new], tools, add_generation_prompt=True)
        if text.count(_MARKER) != 1:
            raise ValueError("the chat template does not render an assistant message's content as given")
        after = text[text.index(_MARKER) + len(_MARKER) :]
        if output_ids and output_ids[-1] in self.special_ids:
            end_of_turn = self.tokenizer.decode(output_ids[-1:])
            after = after.removeprefix(end_of_turn)
        return self.encode_after(after)

    def encode_after(self, text: str) -> list[int]:
        """``text`` tokenised as it is when it follows other text: SentencePiece tokenizers (Llama 2,
        Mistral) give text of its own a leading word boundary, so it is tokenised after an end-of-sequence
        token (a special token, which no text merges with) and that token's ids dropped."""
        eos = getattr(self.tokenizer, "eos_token", None)
        if not eos or not text:
            return self.encode(text)
        anchor = self.encode(eos)
        ids = self.encode(eos + text)
        return ids[len(anchor) :] if ids[: len(anchor)] == anchor else self.encode(text)

    def _template_message(self, message: dict[str, Any]) -> dict[str, Any]:
        """A canonical message as the template takes it; calls become content where it renders none."""
        calls = message.get("tool_calls")
        if not calls:
            return {k: v for k, v in message.items() if k != "tool_calls"}
        if self.renders_calls:
            return {
                **message,
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": c["name"], "arguments": copy.deepcopy(c["arguments"])},
                    }
                    for c in calls
                ],
            }
        if self.parser.format_calls is None:
            raise ValueError(
                f"the chat template renders no tool calls and tool_call_parser {self.parser.name!r} "
                "has no format_calls to write them"
            )
        written = self.parser.format_calls([FunctionCall(c["name"], c["arguments"]) for c in calls])
        content = "\n".join(part for part in (message.get("content") or "", written) if part)
        return {"role": message["role"], "content": content}


def canonical_message(message: Any, where: str) -> dict[str, Any]:
    """A request message reduced to what the model sees: role, text content (parts joined, None as ""),
    ``name``, and tool calls as (name, parsed arguments). Ids and unknown keys are left out, so a message
    sent back as the client library serialises it compares equal to the one the server returned."""
    if not isinstance(message, dict):
        raise TypeError(f"{where} must be an object, got {type(message).__name__}")
    role = message.get("role")
    if role not in ("system", "developer", "user", "assistant", "tool"):
        raise ValueError(f"{where}.role must be system, developer, user, assistant or tool, got {role!r}")
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise ValueError(f"{where}.content: only text parts are supported, got {str(part)[:80]!r}")
            texts.append(part["text"])
        content = "".join(texts)
    elif content is not None and not isinstance(content, str):
        raise ValueError(f"{where}.content must be a string, a list of text parts or null")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content or ""}
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    calls = message.get("tool_calls") if role == "assistant" else None
    if calls:
        if not isinstance(calls, list):
            raise TypeError(f"{where}.tool_calls must be a list")
        out["tool_calls"] = [
            _canonical_call(call, f"{where}.tool_calls[{i}]") for i, call in enumerate(calls)
        ]
    return out


def _canonical_call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise TypeError(
            f"{where} must be {{'type': 'function', 'function': {{'name': ..., 'arguments': ...}}}}"
        )
    return canonical_call(function["name"], function.get("arguments", "{}"), f"{where}.function.arguments")


def canonical_call(name: str, arguments: Any, where: str) -> dict[str, Any]:
    """A tool call as the session compares it: its name, and its arguments as an object; text that is no
    JSON object (what a model wrote broken, sent back as it came) stays text."""
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            return {"name": name, "arguments": arguments}
        arguments = parsed if isinstance(parsed, dict) else arguments
    elif not isinstance(arguments, dict):
        raise TypeError(f"{where} must be a JSON object or its text")
    return {"name": name, "arguments": arguments}
