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
from ..plugins.kinds import ToolCallParser
from ..plugins.records import Resolved
from ..sizes import Budget, json_chars, max_prompt_chars
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
    """A checked request (``/v1/chat/completions``, or ``/v1/messages`` converted): the one shape both
    APIs are answered from."""

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
    top_k: int | None = None


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
        for i, tool in enumerate(tools or []):
            check_tool_schema(tool["function"].get("parameters"), f"tools[{i}].function.parameters")
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
            model=check_typed(body, "model", str, "") or "",
            messages=canonical,
            tools=tools,
            parse_tools=bool(tools) and choice == "auto",
            n=check_int(body, "n", 1, 1, MAX_CHOICES) or 1,
            stream=bool(check_typed(body, "stream", bool, False)),
            include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
            stop=list(stop),
            max_tokens=check_int(body, "max_completion_tokens", None, 1, None)
            or check_int(body, "max_tokens", None, 1, None),
            temperature=check_number(body, "temperature", 0.0, 2.0),
            top_p=check_number(body, "top_p", 0.0, 1.0),
            seed=check_int(body, "seed", None, 0, 2**63 - 1),
            logprobs=bool(check_typed(body, "logprobs", bool, False)),
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


def check_tool_schema(schema: Any, where: str) -> None:
    """A tool's parameters are a JSON schema object (absent: no parameters); its sub-schemas may be any
    JSON schema, booleans included, which every reader of it takes as they come."""
    if schema is not None and not isinstance(schema, dict):
        raise ValueError(f"{where} must be a JSON schema object, got {type(schema).__name__}")
    properties = (schema or {}).get("properties")
    if properties is not None and not isinstance(properties, dict):
        raise ValueError(f"{where}.properties must be an object of schemas, got {type(properties).__name__}")


def check_typed(body: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise TypeError(f"{key} must be a {kind.__name__}, got {value!r:.60}")
    return value


def check_int(body: dict[str, Any], key: str, default: int | None, low: int, high: int | None) -> int | None:
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


def check_number(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
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


@dataclass
class Answer:
    """One finished choice: the model's turn read by the tool-call parser, the session's record of it, and
    the stop string that ended it (None when a token or the length did)."""

    parsed: ParsedTurn
    choice: Choice
    stop_sequence: str | None


@dataclass
class TextDelta:
    """Streamed text of choice ``index`` (held back from a possible stop string or tool call), with the
    log-prob entries ``[logprob, token id]`` sampled since the last event."""

    index: int
    text: str
    entries: list[list[Any]]


@dataclass
class Finished:
    """Choice ``index`` is done: ``rest`` is the content not yet streamed."""

    index: int
    answer: Answer
    rest: str
    entries: list[list[Any]]


@dataclass
class Turned:
    """A whole turn, streamed or not: its prompt ids and each choice's answer (both APIs format it)."""

    prompt_ids: list[int]
    answers: list[Answer]

    @property
    def usage(self) -> tuple[int, int]:
        """(prompt tokens, sampled tokens)."""
        return len(self.prompt_ids), sum(len(a.choice.output_ids) for a in self.answers)


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
        context = getattr(tokenizer, "model_max_length", None)
        self.max_prompt_chars = max_prompt_chars(
            context if isinstance(context, int) and context < 1 << 24 else None
        )
        """Characters a request's messages and tools may hold; more is a 400 before any template work."""
        self.budget = Budget(
            bytes=12 * self.max_prompt_chars + (1 << 20),  # \uXXXX escapes: up to 12 bytes a character
            values=self.max_prompt_chars + (1 << 16),
            depth=None,  # what is rendered is walked by json_chars in prepare(), up to max_prompt_chars
        )
        """What a request body may cost before it is parsed (:mod:`rlsdk.sizes`): a body within it holds at
        most about :attr:`max_prompt_chars` JSON values."""

    # ---------------------------------------------------------------------------------- preparing

    def prepare(self, request: ChatRequest, session: Session | None) -> _Prepared:
        """The prompt ids (exactly the recorded ones for the part a session already holds) and sampling."""
        size = json_chars([request.messages, request.tools], self.max_prompt_chars)
        if size > self.max_prompt_chars:  # before the chat template and the tokenizer (S10)
            raise ChatRequestError(
                f"the messages and tools hold more than {self.max_prompt_chars:,} characters, more than "
                "the model's context can take"
            )
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
        if request.top_k is not None:
            sampling["top_k"] = request.top_k
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

    def _answer(self, request: ChatRequest, output: dict[str, Any]) -> Answer:
        """One engine response as a parsed turn and the session's record of it."""
        meta = output["meta_info"]
        finish_reason = meta.get("finish_reason") or {}
        finish = finish_reason.get("type")
        if finish == "abort":
            raise GenerationAborted("the engine aborted the turn")
        entries = meta.get("output_token_logprobs") or []
        text = output.get("text", "")
        parsed = self._parse(text, request.tools) if request.parse_tools else ParsedTurn(text)
        reason = "length" if finish == "length" else "tool_calls" if parsed.calls else "stop"
        message = canonical_message(_assistant(parsed), "the answer")
        matched = finish_reason.get("matched")
        choice = Choice(
            message,
            [int(e[1]) for e in entries],
            [float(e[0]) for e in entries],
            reason,
            str(meta.get("weight_version", "default")),
            malformed_calls=parsed.malformed + sum(isinstance(c.arguments, str) for c in parsed.calls),
        )
        return Answer(parsed, choice, matched if finish == "stop" and isinstance(matched, str) else None)

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

    async def turn(self, request: ChatRequest, session: Session | None) -> Turned:
        """Answer ``request`` as a whole (each of its ``n`` choices), recorded in ``session``."""
        prepared = self.prepare(request, session)
        payloads = self._payloads(prepared, request.n)
        outputs: list[Any]
        try:
            if prepared.sampling["max_new_tokens"] == 0:
                outputs = [_empty_output() for _ in payloads]
            else:
                outputs = list(await asyncio.gather(*(self.engine.generate(p) for p in payloads)))
            answers = [self._answer(request, output) for output in outputs]
        except BaseException as exc:  # the engine refused or aborted it, or the client went away
            _failed(prepared.turn, exc)
            if isinstance(exc, asyncio.CancelledError):
                await asyncio.gather(*(self.engine.abort(p["rid"]) for p in payloads), return_exceptions=True)
            raise
        if prepared.turn is not None:
            prepared.turn.choices = [answer.choice for answer in answers]
        return Turned(prepared.prompt_ids, answers)

    async def events(
        self, request: ChatRequest, session: Session | None
    ) -> AsyncGenerator[Turned | TextDelta | Finished]:
        """Answer ``request`` as it is generated: first an empty :class:`Turned` (the request is checked and
        its prompt made by then), then :class:`TextDelta` and :class:`Finished` events, and last the whole
        :class:`Turned`, recorded in ``session``."""
        prepared = self.prepare(request, session)
        payloads = self._payloads(prepared, request.n)
        if prepared.sampling["max_new_tokens"] == 0:
            streams = merge_streams([_single(_empty_output()) for _ in payloads])
        else:
            streams = merge_streams([self.engine.generate_stream(p) for p in payloads])
        stops = prepared.sampling.get("stop", [])
        marker = self.marker if request.parse_tools else None
        sent_text = [""] * request.n
        sent_tokens = [0] * request.n
        finished: list[Answer | None] = [None] * request.n
        yield Turned(prepared.prompt_ids, [])
        try:
            async for output in streams:
                i = output["index"]
                meta = output["meta_info"]
                entries = (meta.get("output_token_logprobs") or [])[sent_tokens[i] :]
                sent_tokens[i] += len(entries)
                if meta.get("finish_reason") is None:
                    visible = _held_back(output.get("text", ""), stops, marker)
                    delta = ""
                    if visible != sent_text[i] and visible.startswith(sent_text[i]):
                        delta, sent_text[i] = visible[len(sent_text[i]) :], visible
                    if delta or entries:
                        yield TextDelta(i, delta, entries)
                    continue
                answer = finished[i] = self._answer(request, output)
                content = answer.parsed.content
                rest = content[len(sent_text[i]) :] if content.startswith(sent_text[i]) else ""
                yield Finished(i, answer, rest, entries)
        except BaseException as exc:
            _failed(prepared.turn, exc)
            await asyncio.gather(*(self.engine.abort(p["rid"]) for p in payloads), return_exceptions=True)
            raise
        answers = [a for a in finished if a is not None]
        if prepared.turn is not None:
            prepared.turn.choices = [a.choice for a in answers]
        yield Turned(prepared.prompt_ids, answers)

    # ---------------------------------------------------------------------------------- OpenAI's shapes

    async def complete(self, request: ChatRequest, session: Session | None) -> dict[str, Any]:
        """The ``chat.completion`` body for ``request``."""
        turned = await self.turn(request, session)
        body = self._envelope("chat.completion")
        body["choices"] = [
            {
                "index": i,
                "message": _response_message(answer.parsed),
                "logprobs": self._logprobs(request, answer.choice, 0),
                "finish_reason": answer.choice.finish_reason,
            }
            for i, answer in enumerate(turned.answers)
        ]
        body["usage"] = _usage(*turned.usage)
        return body

    async def stream(self, request: ChatRequest, session: Session | None) -> AsyncGenerator[dict[str, Any]]:
        """``chat.completion.chunk`` bodies: content as it comes (held back from a possible stop string or
        tool call), then each choice's tool calls and finish reason."""
        envelope = self._envelope("chat.completion.chunk")
        async for event in self.events(request, session):
            if isinstance(event, Turned):
                if not event.answers:
                    for i in range(request.n):
                        yield {**envelope, "choices": [_chunk(i, {"role": "assistant", "content": ""})]}
                elif request.include_usage:
                    yield {**envelope, "choices": [], "usage": _usage(*event.usage)}
                continue
            logprobs = self._token_logprobs(event.entries) if request.logprobs else None
            if isinstance(event, TextDelta):
                if event.text or logprobs:
                    delta = {"content": event.text} if event.text else {}
                    yield {**envelope, "choices": [_chunk(event.index, delta, logprobs)]}
                continue
            rest: dict[str, Any] = {"content": event.rest} if event.rest else {}
            if event.answer.parsed.calls:
                calls = _tool_calls(event.answer.parsed)
                rest["tool_calls"] = [{"index": k, **call} for k, call in enumerate(calls)]
            reason = event.answer.choice.finish_reason
            yield {**envelope, "choices": [_chunk(event.index, rest, logprobs, reason)]}

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


def arguments_text(arguments: dict[str, Any] | str) -> str:
    """A call's arguments as JSON text; arguments the model wrote as no JSON object stay as it wrote them."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _tool_calls(parsed: ParsedTurn) -> list[dict[str, Any]]:
    return [
        {
            "id": f"call_{secrets.token_hex(12)}",
            "type": "function",
            "function": {"name": call.name, "arguments": arguments_text(call.arguments)},
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
