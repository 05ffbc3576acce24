"""The OpenAI-compatible routes (``/v1/models``, ``/v1/chat/completions``), Anthropic's ``/v1/messages`` and
the session routes, added to ``rlsdk serve`` and the run's loopback server, or served on their own in front
of any engine (an SGLang server or router by URL: :func:`start_chat_server`).

A session's OpenAI client uses the base URL ``<server>/sessions/<id>/v1``, its Anthropic client
``<server>/sessions/<id>``; ``POST /sessions`` opens one, ``GET /sessions/<id>`` returns its record (turns,
forks, the tree of token segments, the training trajectory) and ``DELETE`` closes it.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web

from .._version import __version__
from ..engines.engine import InferenceEngine
from ..engines.protocol import SERVE_TOKEN_ENV, EngineRequestError
from ..engines.service_guard import ConnectionLimits, Served, check_binding, guard
from ..errors import PluginCallError
from ..plugins.manager import RlsdkPluginManager, get_plugin_manager
from ..plugins.records import PluginInfo, Resolved
from ..sizes import NotJson, TooCostly, parse_request
from .completions import ChatEndpoint, ChatRequest, ChatRequestError, GenerationAborted, parse_chat_request
from .messages import anthropic_error_body, create_message, parse_messages_request, stream_message
from .sessions import Session
from .tool_parsers import builtin_parsers
from .tree import session_tree

_CHAT = web.AppKey("chat", ChatEndpoint)
MAX_BODY = 16 * 1024 * 1024


def resolve_parser(pm: RlsdkPluginManager, spec: str, tokenizer: Any) -> Resolved:
    """The tool-call parser by name (or dotted path), one per model family; ``auto`` is ``hermes`` for chat
    templates that write ``<tool_call>``, ``mistral`` for those that write ``[TOOL_CALLS]`` and ``json``
    otherwise. Core's own parsers are there even in a manager without them."""
    if spec == "auto":
        template = str(getattr(tokenizer, "chat_template", None) or "")
        spec = "hermes" if "<tool_call>" in template else "mistral" if "[TOOL_CALLS]" in template else "json"
    if spec not in pm.names("tool_call_parser"):
        builtin = {record.name: record for record in builtin_parsers()}
        if spec in builtin:
            return Resolved(builtin[spec], PluginInfo("agents", "rlsdk", __version__, "rlsdk.agents.plugin"))
    return pm.resolve("tool_call_parser", spec)


NO_CHAT_TEMPLATE = (
    "the engine's tokenizer ({tokenizer}) has no chat template, which /v1/chat/completions and /v1/messages "
    "need to render a conversation: serve a model whose tokenizer has one (a FakeEngine in a test: "
    "FakeEngine(replies, rlsdk.testing.ChatTokenizer()))"
)


CHAT_PATHS = ("/v1/chat/completions", "/v1/messages", "/sessions")
"""The chat routes a client POSTs to first: a server without a chat template answers them with why."""


async def chat_endpoint(
    engine: InferenceEngine,
    tokenizer: Any,
    *,
    pm: RlsdkPluginManager | None = None,
    tool_call_parser: str = "auto",
    template_kwargs: dict[str, Any] | None = None,
) -> ChatEndpoint:
    """A chat endpoint on a started ``engine``, named after its model as SGLang names it; a ``tokenizer``
    without a chat template is a ValueError saying so (:data:`NO_CHAT_TEMPLATE`)."""
    if not getattr(tokenizer, "chat_template", None) or not hasattr(tokenizer, "apply_chat_template"):
        raise ValueError(NO_CHAT_TEMPLATE.format(tokenizer=type(tokenizer).__name__))
    parser = resolve_parser(pm or get_plugin_manager(), tool_call_parser, tokenizer)
    model_id = str((await engine.model_info()).get("model_path") or "default")
    return ChatEndpoint(engine, tokenizer, parser, model_id, template_kwargs=template_kwargs)


def add_chat_routes(app: web.Application, chat: ChatEndpoint) -> None:
    app[_CHAT] = chat
    app.add_routes(
        [
            web.get("/v1/models", _models),
            web.post("/v1/chat/completions", _completions),
            web.post("/sessions", _open_session),
            web.get("/sessions/{session}", _session_record),
            web.delete("/sessions/{session}", _close_session),
            web.get("/sessions/{session}/v1/models", _models),
            web.post("/sessions/{session}/v1/chat/completions", _completions),
            web.post("/v1/messages", _messages),
            web.post("/sessions/{session}/v1/messages", _messages),
        ]
    )


def openai_error(message: str, status: int) -> web.Response:
    """OpenAI's error body."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}, status=status
    )


def anthropic_error(message: str, status: int) -> web.Response:
    """Anthropic's error body."""
    return web.json_response(anthropic_error_body(message, status), status=status)


class UnknownSession(LookupError):
    """A session route for an id that is not open: answered 404."""


def _session(request: web.Request) -> Session | None:
    """The request's session (None outside ``/sessions/<id>/``)."""
    session_id = request.match_info.get("session")
    if session_id is None:
        return None
    session = request.app[_CHAT].sessions.get(session_id)
    if session is None:
        raise UnknownSession(f"no open session {session_id[:64]!r}")
    return session


def _api_errors(error: Any) -> Any:
    """Unknown sessions and full stores get the API's own error body, whatever the app's middleware does."""

    def wrap(handler: Any) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                return await handler(request)
            except UnknownSession as exc:
                return error(str(exc), 404)
            except OverflowError as exc:
                return error(str(exc), 429)

        return handle

    return wrap


_openai_errors = _api_errors(openai_error)


@_openai_errors
async def _models(request: web.Request) -> web.Response:
    _session(request)
    return web.json_response(request.app[_CHAT].models())


async def _chat_request(request: web.Request, parse: Any) -> ChatRequest:
    """The body checked by ``parse``, after it is found within the endpoint's budget (413 otherwise)."""
    try:
        body = await parse_request(await request.read(), request.app[_CHAT].budget)
    except NotJson as exc:
        raise ChatRequestError(str(exc)) from None
    if not isinstance(body, dict):
        raise ChatRequestError("request body must be a JSON object")
    return parse(body)


async def _answer(
    request: web.Request, parse: Any, whole: Any, stream: Any, error: Any
) -> web.StreamResponse:
    """One turn through either API: ``parse`` checks the body, ``whole`` answers it as one JSON body and
    ``stream`` as (event name or None, data) pairs; ``error`` is the API's error body."""
    chat = request.app[_CHAT]
    session = _session(request)
    if session is not None and session.aborted:  # the step is over for this sample: nothing more runs
        return error("the session's generation was aborted", 503)
    try:
        chat_request = await _chat_request(request, parse)
        if not chat_request.stream:
            return web.json_response(await whole(chat, chat_request, session))
        events = stream(chat, chat_request, session)
        first = await anext(events)  # a bad request fails here, before the 200 is sent
    except PluginCallError as exc:  # the tool-call parser failed
        return error(str(exc), 500)
    except TooCostly as exc:  # over the route's budget, before any work
        return error(str(exc), exc.status)
    except (ChatRequestError, EngineRequestError, ValueError) as exc:
        return error(str(exc), 400)
    except GenerationAborted as exc:
        if session is not None:
            session.aborted = True
        return error(str(exc), 503)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    try:
        await response.write(_event(*first))
        async for event in events:
            await response.write(_event(*event))
        if stream is _openai_stream:
            await response.write(b"data: [DONE]\n\n")
    except (GenerationAborted, PluginCallError) as exc:  # after the 200: an error event, as both APIs send
        if session is not None and isinstance(exc, GenerationAborted):
            session.aborted = True
        body = json.loads(error(str(exc), 500).text)
        await response.write(_event("error" if stream is not _openai_stream else None, body))
    except (ConnectionResetError, asyncio.CancelledError):
        await events.aclose()
        raise
    return response


async def _openai_stream(chat: ChatEndpoint, chat_request: ChatRequest, session: Session | None) -> Any:
    async for chunk in chat.stream(chat_request, session):
        yield None, chunk


@_openai_errors
async def _completions(request: web.Request) -> web.StreamResponse:
    return await _answer(
        request, parse_chat_request, lambda chat, r, s: chat.complete(r, s), _openai_stream, openai_error
    )


@_api_errors(anthropic_error)
async def _messages(request: web.Request) -> web.StreamResponse:
    return await _answer(request, parse_messages_request, create_message, stream_message, anthropic_error)


def _event(name: str | None, data: dict[str, Any]) -> bytes:
    """A server-sent event: ``data:`` only (OpenAI), or named (Anthropic)."""
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


@_openai_errors
async def _open_session(request: web.Request) -> web.Response:
    return web.json_response({"id": request.app[_CHAT].sessions.open().id})


@_openai_errors
async def _session_record(request: web.Request) -> web.Response:
    session = _session(request)
    assert session is not None
    return web.json_response(session_record(session))


@_openai_errors
async def _close_session(request: web.Request) -> web.Response:
    session = _session(request)
    assert session is not None
    request.app[_CHAT].sessions.close(session.id)
    return web.json_response(session_record(session))


def session_record(session: Session) -> dict[str, Any]:
    """A session as JSON: every turn (prompt ids, choices with sampled ids and log-probs), its forks and
    the trajectory for training (None before the first answer)."""
    trajectory = session.trajectory()
    return {
        "id": session.id,
        "turns": [asdict(turn) for turn in session.turns],
        "forks": session.forks(),
        "tree": session_tree(session),
        "trajectory": asdict(trajectory) if trajectory is not None else None,
    }


@dataclass
class ChatServer(Served):
    """A running :func:`start_chat_server`: ``url`` is ``http://host:port``; ``await close()`` stops it."""

    chat: ChatEndpoint


async def start_chat_server(
    chat: ChatEndpoint,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    token: str | None = None,
    max_connections: int = 1024,
    allowed_hosts: tuple[str, ...] | list[str] = (),
) -> ChatServer:
    """Serve ``chat`` (an endpoint on any engine, e.g. an SGLang client) on its own: the OpenAI and
    session routes and ``/health``, under the rules of :mod:`rlsdk.engines.service_guard`."""
    check_binding("the chat endpoint", host, token, SERVE_TOKEN_ENV)
    limits = ConnectionLimits(max_body=MAX_BODY, max_connections=max_connections)
    app = limits.app([guard(token, openai_error, bind_host=host, allowed_hosts=allowed_hosts)], openai_error)
    app.add_routes([web.get("/health", _health)])
    add_chat_routes(app, chat)
    runner, bound = await limits.serve(app, host, port)
    server = ChatServer(host, bound, runner, limits, chat)
    server.share_token(token)
    return server


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)
