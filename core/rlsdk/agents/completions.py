"""``/v1/chat/completions`` answered by any engine speaking SGLang's ``/generate``: requests checked and
turned into token ids (through a session when there is one), the model's text split into content and
tool calls by the tool-call parser, OpenAI's response and stream chunk shapes."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..aio.streams import merge_streams
from ..engines.engine import InferenceEngine
from ..engines.protocol import new_rid
from ..errors import PluginCallError
from ..plugins.records import Resolved, ToolCallParser
from .chat_template import ChatTemplate, canonical_message
from .sessions import Choice, Session, SessionStore, Turn
from .tool_parsers import ParsedTurn

MAX_CHOICES = 16
MAX_STOPS = 16
DEFAULT_MAX_TOKENS = 1024
SESSION_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "sampling_seed", "stop_token_ids")
"""Sampling parameters a session's own (the run's) override in requests: training needs the rollout's
distribution whatever temperature the agent asks for."""


class ChatRequestError(ValueError):
    """A malformed chat request: answered 400 with OpenAI's error body."""


class GenerationAborted(RuntimeError):
    """The engine aborted the turn (the step ended, or weights are being updated)."""


@dataclass
class ChatRequest:
    """A checked ``/v1/chat/completions`` body."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    parse_tools: bool
    n: int
    stream: bool
    include_usage: bool
    stop: list[str]
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    seed: int | None
    logprobs: bool


def parse_chat_request(body: dict[str, Any]) -> ChatRequest:
    """Check a request body; anything malformed or unsupported raises :class:`ChatRequestError`."""
    try:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        canonical = [canonical_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
        tools = body.get("tools") or None
        if tools is not None and (
            not isinstance(tools, list) or not all(_is_function_tool(t) for t in tools)
        ):
            raise ValueError("tools must be a list of {'type': 'function', 'function': {'name': ...}}")
        choice = body.get("tool_choice", "auto")
        if choice not in ("auto", "none"):
            raise ValueError(
                f"tool_choice {choice!r} is not supported (no constrained decoding): use auto or none"
            )
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if (
            not isinstance(stop, list)
            or len(stop) > MAX_STOPS
            or not all(isinstance(s, str) and s for s in stop)
        ):
            raise ValueError(f"stop must be a string or a list of at most {MAX_STOPS} non-empty strings")
        if body.get("top_logprobs"):
            raise ValueError("top_logprobs is not supported: logprobs gives each sampled token's log-prob")
        options = body.get("stream_options") or {}
        return ChatRequest(
            model=_typed(body, "model", str, "") or "",
            messages=canonical,
            tools=tools,
            parse_tools=bool(tools) and choice == "auto",
            n=_bounded(body, "n", 1, 1, MAX_CHOICES) or 1,
            stream=bool(_typed(body, "stream", bool, False)),
            include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
            stop=list(stop),
            max_tokens=_bounded(body, "max_completion_tokens", None, 1, None)
            or _bounded(body, "max_tokens", None, 1, None),
            temperature=_number(body, "temperature", 0.0, 2.0),
            top_p=_number(body, "top_p", 0.0, 1.0),
            seed=_bounded(body, "seed", None, 0, 2**63 - 1),
            logprobs=bool(_typed(body, "logprobs", bool, False)),
        )
    except (ValueError, TypeError) as exc:
        raise ChatRequestError(str(exc)) from None


def _is_function_tool(tool: Any) -> bool:
    return (
        isinstance(tool, dict)
        and tool.get("type", "function") == "function"
        and isinstance(tool.get("function"), dict)
        and isinstance(tool["function"].get("name"), str)
    )


def _typed(body: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise TypeError(f"{key} must be a {kind.__name__}, got {value!r:.60}")
    return value


def _bounded(body: dict[str, Any], key: str, default: int | None, low: int, high: int | None) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        raise ValueError(
            f"{key} must be an integer in [{low}, {high if high is not None else 'inf'}], got {value!r:.60}"
        )
    return value


def _number(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError(f"{key} must be a number in [{low:g}, {high:g}], got {value!r:.60}")
    return float(value)


@dataclass
class _Prepared:
    """A request turned into the engine's terms: the prompt ids, and the session's turn being recorded."""

    prompt_ids: list[int]
    sampling: dict[str, Any]
    turn: Turn | None


class ChatEndpoint:
    """Chat completions on ``engine`` with ``tokenizer``'s chat template and the tool-call ``parser`` (a
    resolved tool_call_parser). Requests through a session of ``sessions`` are recorded token for token."""

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: Any,
        parser: Resolved,
        model_id: str,
        *,
        sessions: SessionStore | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.parser = parser
        self.model_id = model_id
        self.sessions = sessions or SessionStore()
        record = parser.record
        assert isinstance(record, ToolCallParser)
        self.marker = record.marker
        self.template = ChatTemplate(tokenizer, record, template_kwargs)

    # ---------------------------------------------------------------------------------- preparing

    def prepare(self, request: ChatRequest, session: Session | None) -> _Prepared:
        """The prompt ids (exactly the recorded ones for the part a session already holds) and sampling."""
        turn = None
        parent = None
        if session is None:
            prompt = self.template.prompt_ids(request.messages, request.tools)
        else:
            plan = session.plan(request.messages, request.tools)
            parent = plan.parent
            if parent is None:
                prompt = self.template.prompt_ids(request.messages, request.tools)
            else:
                history, recorded, output = session.recorded_ids(parent)
                prompt = recorded + self.template.continuation_ids(
                    history, output, plan.new_messages, request.tools
                )
            turn = session.record_turn(request.messages, request.tools, prompt, plan)
        limit = request.max_tokens or DEFAULT_MAX_TOKENS
        if session is not None:
            if session.max_response_tokens is not None:
                limit = min(limit, session.max_response_tokens - session.response_tokens(prompt, parent))
            if session.max_context_tokens is not None:
                limit = min(limit, session.max_context_tokens - len(prompt))
        sampling: dict[str, Any] = {
            "temperature": 1.0 if request.temperature is None else request.temperature,
            "max_new_tokens": max(limit, 0),
            "skip_special_tokens": True,
            "no_stop_trim": False,
            "spaces_between_special_tokens": False,
        }
        if request.top_p is not None:
            sampling["top_p"] = request.top_p
        if request.seed is not None:
            sampling["sampling_seed"] = request.seed
        stop = list(request.stop)
        if session is not None:
            sampling.update(
                {k: v for k, v in session.sampling.items() if k in SESSION_SAMPLING and v is not None}
            )
            stop += [s for s in session.sampling.get("stop") or [] if s not in stop]
        if stop:
            sampling["stop"] = stop
        return _Prepared(prompt, sampling, turn)

    def _payloads(self, prepared: _Prepared, n: int) -> list[dict[str, Any]]:
        return [
            {
                "input_ids": prepared.prompt_ids,
                "sampling_params": prepared.sampling,
                "return_logprob": True,
                "rid": new_rid(),
            }
            for _ in range(n)
        ]

    def _choice(self, request: ChatRequest, output: dict[str, Any]) -> tuple[ParsedTurn, Choice]:
        """One engine response as a parsed turn and the session's record of it."""
        meta = output["meta_info"]
        finish = (meta.get("finish_reason") or {}).get("type")
        if finish == "abort":
            raise GenerationAborted("the engine aborted the turn")
        entries = meta.get("output_token_logprobs") or []
        text = output.get("text", "")
        parsed = self._parse(text, request.tools) if request.parse_tools else ParsedTurn(text)
        reason = "length" if finish == "length" else "tool_calls" if parsed.calls else "stop"
        message = canonical_message(_assistant(parsed), "the answer")
        return parsed, Choice(
            message,
            [int(e[1]) for e in entries],
            [float(e[0]) for e in entries],
            reason,
            str(meta.get("weight_version", "default")),
        )

    def _parse(self, text: str, tools: list[dict[str, Any]] | None) -> ParsedTurn:
        """The tool_call_parser plugin's reading of a turn; its failure names it."""
        try:
            parsed = self.parser.func(text, tools)
        except Exception as exc:
            raise PluginCallError(f"{self.parser.describe()} raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(parsed, ParsedTurn):
            raise PluginCallError(
                f"{self.parser.describe()} returned {type(parsed).__name__}, expected rlsdk.agents.ParsedTurn"
            )
        return parsed

    # ---------------------------------------------------------------------------------- answering

    async def complete(self, request: ChatRequest, session: Session | None) -> dict[str, Any]:
        """The ``chat.completion`` body for ``request``."""
        prepared = self.prepare(request, session)
        payloads = self._payloads(prepared, request.n)
        outputs: list[Any]
        try:
            if prepared.sampling["max_new_tokens"] == 0:
                outputs = [_empty_output() for _ in payloads]
            else:
                outputs = list(await asyncio.gather(*(self.engine.generate(p) for p in payloads)))
            results = [self._choice(request, output) for output in outputs]
        except BaseException as exc:  # the engine refused or aborted it, or the client went away
            _failed(prepared.turn, exc)
            if isinstance(exc, asyncio.CancelledError):
                await asyncio.gather(*(self.engine.abort(p["rid"]) for p in payloads), return_exceptions=True)
            raise
        if prepared.turn is not None:
            prepared.turn.choices = [choice for _, choice in results]
        body = self._envelope("chat.completion")
        body["choices"] = [
            {
                "index": i,
                "message": _response_message(parsed),
                "logprobs": self._logprobs(request, choice, 0),
                "finish_reason": choice.finish_reason,
            }
            for i, (parsed, choice) in enumerate(results)
        ]
        body["usage"] = _usage(len(prepared.prompt_ids), sum(len(c.output_ids) for _, c in results))
        return body

    async def stream(self, request: ChatRequest, session: Session | None) -> AsyncGenerator[dict[str, Any]]:
        """``chat.completion.chunk`` bodies: content as it comes (held back from a possible stop string or
        tool call), then each choice's tool calls and finish reason."""

        prepared = self.prepare(request, session)
        payloads = self._payloads(prepared, request.n)
        envelope = self._envelope("chat.completion.chunk")
        if prepared.sampling["max_new_tokens"] == 0:
            streams = merge_streams([_single(_empty_output()) for _ in payloads])
        else:
            streams = merge_streams([self.engine.generate_stream(p) for p in payloads])
        stops = prepared.sampling.get("stop", [])
        marker = self.marker if request.parse_tools else None
        sent_text = [""] * request.n
        sent_tokens = [0] * request.n
        finished: list[Choice | None] = [None] * request.n
        for i in range(request.n):
            yield {**envelope, "choices": [_chunk(i, {"role": "assistant", "content": ""})]}
        try:
            async for output in streams:
                i = output["index"]
                meta = output["meta_info"]
                entries = meta.get("output_token_logprobs") or []
                logprobs = None
                if request.logprobs:
                    logprobs = self._token_logprobs(entries[sent_tokens[i] :])
                sent_tokens[i] = len(entries)
                if meta.get("finish_reason") is None:
                    visible = _held_back(output.get("text", ""), stops, marker)
                    if visible != sent_text[i] and visible.startswith(sent_text[i]):
                        delta, sent_text[i] = visible[len(sent_text[i]) :], visible
                        yield {**envelope, "choices": [_chunk(i, {"content": delta}, logprobs)]}
                    elif logprobs:
                        yield {**envelope, "choices": [_chunk(i, {}, logprobs)]}
                    continue
                parsed, choice = self._choice(request, output)
                finished[i] = choice
                rest: dict[str, Any] = {}
                if parsed.content.startswith(sent_text[i]) and len(parsed.content) > len(sent_text[i]):
                    rest["content"] = parsed.content[len(sent_text[i]) :]
                if parsed.calls:
                    rest["tool_calls"] = [{"index": k, **call} for k, call in enumerate(_tool_calls(parsed))]
                yield {**envelope, "choices": [_chunk(i, rest, logprobs, choice.finish_reason)]}
        except BaseException as exc:
            _failed(prepared.turn, exc)
            await asyncio.gather(*(self.engine.abort(p["rid"]) for p in payloads), return_exceptions=True)
            raise
        choices = [c for c in finished if c is not None]
        if prepared.turn is not None:
            prepared.turn.choices = choices
        if request.include_usage:
            usage = _usage(len(prepared.prompt_ids), sum(len(c.output_ids) for c in choices))
            yield {**envelope, "choices": [], "usage": usage}

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{secrets.token_hex(12)}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model_id,
            "system_fingerprint": None,
        }

    def _logprobs(self, request: ChatRequest, choice: Choice, start: int) -> dict[str, Any] | None:
        if not request.logprobs:
            return None
        return self._token_logprobs(
            [[lp, tok] for lp, tok in zip(choice.logprobs, choice.output_ids)][start:]
        )

    def _token_logprobs(self, entries: list[list[Any]]) -> dict[str, Any]:
        content = []
        for entry in entries:
            text = self.tokenizer.decode([int(entry[1])])
            content.append(
                {"token": text, "logprob": float(entry[0]), "bytes": list(text.encode()), "top_logprobs": []}
            )
        return {"content": content}

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": self.model_id, "object": "model", "created": 0, "owned_by": "rlsdk"}],
        }


def _failed(turn: Turn | None, exc: BaseException) -> None:
    if turn is not None:
        turn.error = f"{type(exc).__name__}: {exc}"


def _held_back(text: str, stops: list[str], marker: str | None) -> str:
    """The part of a turn's text that may be shown before it ends: up to a tool call's ``marker`` (None
    when the turn's calls are not parsed), and short of any tail that could begin a stop string or the
    marker. With a marker it is stripped, as the parsed content is."""
    cut = len(text)
    if marker and marker in text:
        cut = text.index(marker)
    for hold in [*stops, *([marker] if marker else [])]:
        for k in range(min(len(hold) - 1, cut), 0, -1):
            if text[:cut].endswith(hold[:k]):
                cut -= k
                break
    shown = text[:cut]
    return shown.strip() if marker is not None else shown


def _tool_calls(parsed: ParsedTurn) -> list[dict[str, Any]]:
    return [
        {
            "id": f"call_{secrets.token_hex(12)}",
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
        }
        for call in parsed.calls
    ]


def _assistant(parsed: ParsedTurn) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content or None}
    if parsed.calls:
        message["tool_calls"] = _tool_calls(parsed)
    return message


def _response_message(parsed: ParsedTurn) -> dict[str, Any]:
    return {**_assistant(parsed), "refusal": None}


def _chunk(
    index: int,
    delta: dict[str, Any],
    logprobs: dict[str, Any] | None = None,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _empty_output() -> dict[str, Any]:
    """What a turn with no tokens left answers: nothing, stopped by length."""
    return {
        "text": "",
        "output_ids": [],
        "meta_info": {"finish_reason": {"type": "length", "length": 0}, "output_token_logprobs": []},
    }


async def _single(output: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    yield output
