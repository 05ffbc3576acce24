"""Serve any :class:`~rlsdk.engines.engine.InferenceEngine` over HTTP with SGLang's native endpoints.

``rlsdk serve`` puts the embedded engine behind this; the rollout loop does the same on loopback so
that slime-style generators POSTing to ``/generate`` work unchanged. Responses follow SGLang 0.5.17
(captured in ``tests/fixtures/sglang-0.5.17.json``): 400 bodies ``{"object": "error", ...}``,
cumulative ``data:`` stream chunks ending in ``data: [DONE]``, an empty 200 for ``/abort_request``,
and a 404 for ``/get_weight_version``, which 0.5.17 removed in favour of ``/model_info``.

Loopback by default; bound anywhere else it needs a bearer token (the rules of
:mod:`rlsdk.engines.service_guard`, shared with the buffer service). ``/update_weights_from_disk`` loads only
from folders the operator allowed (``weights_dirs``); a client that goes away has its generation aborted.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from .._version import __version__
from ..agents.server import CHAT_PATHS, NO_CHAT_TEMPLATE, add_chat_routes, chat_endpoint
from ..aio.streams import merge_streams
from ..engines.engine import InferenceEngine
from ..engines.lora_adapter import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from ..engines.protocol import SERVE_TOKEN_ENV, EngineRequestError, error_body, new_rid, split_batch
from ..engines.service_guard import ConnectionLimits, Served, check_binding, guard
from ..engines.weight_checksums import sglang_answer
from ..sizes import SMALL, Budget, NotJson, TooCostly, parse_request

DEFAULT_MAX_BODY = 64 * 1024 * 1024
"""Largest request body accepted, in bytes (a larger one gets 413)."""
DEFAULT_MAX_CONNECTIONS = 1024
"""Open connections at once (the engine client pools up to its concurrency, 512, plus 8)."""
READ_TIMEOUT = 60.0
"""Seconds a request body may take to arrive (408 after)."""
IDLE_TIMEOUT = 300.0
"""Seconds a connection may stay out of a request (sending one slowly, or idle) before it is closed."""

_FLUSH_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
    "requests, the operation will not be performed.)\n"
)
_WEIGHT_VERSION_GONE = (
    "Endpoint '/get_weight_version' or '/weight_version' is deprecated. Please use '/model_info' instead."
)
_ENGINE = web.AppKey("engine", InferenceEngine)
_WEIGHTS_DIRS = web.AppKey("weights_dirs", tuple)
_GENERATE_BUDGET = web.AppKey("generate_budget", Budget)


@dataclass
class ServerHandle(Served):
    """A running server: ``url`` is ``http://host:port``; ``await close()`` stops it (not the engine)."""

    engine: InferenceEngine
    chat: Any = None
    """The OpenAI-compatible endpoint (:class:`rlsdk.agents.ChatEndpoint`) when the engine has a chat template."""

    async def close(self) -> None:
        if self.engine.url == self.url:
            self.engine.url = None
        await super().close()


async def start_server(
    engine: InferenceEngine,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    max_body: int = DEFAULT_MAX_BODY,
    token: str | None = None,
    weights_dirs: Sequence[str | os.PathLike[str]] = (),
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    pm: Any = None,
    tool_call_parser: str = "auto",
    allowed_hosts: Sequence[str] = (),
    trust_own_process: bool = False,
) -> ServerHandle:
    """Serve a started ``engine`` on ``host:port`` (port 0 picks a free one); sets ``engine.url`` if it has none.

    Off loopback a ``token`` is required (ValueError otherwise). ``/update_weights_from_disk`` loads only
    from inside ``weights_dirs`` (none: it is refused). Slow and idle connections are closed and at most
    ``max_connections`` are open at once (:class:`~rlsdk.engines.service_guard.ConnectionLimits`). An engine
    whose ``tokenizer`` has a chat template also answers ``/v1/chat/completions``
    (:mod:`rlsdk.agents.server`), reading tool calls with ``tool_call_parser`` from ``pm`` (default: the
    installed plugins). On loopback only requests whose ``Host`` is a loopback name or in ``allowed_hosts``
    are answered (DNS rebinding). ``trust_own_process``: requests from this process need no ``token`` (a
    server a run starts for itself, which slime-style code reaches with its own HTTP client)."""
    check_binding("rlsdk serve", host, token, SERVE_TOKEN_ENV)
    limits = ConnectionLimits(
        max_body=max_body,
        read_timeout=READ_TIMEOUT,
        idle_timeout=IDLE_TIMEOUT,
        max_connections=max_connections,
    )
    checks = [
        guard(token, _error, bind_host=host, allowed_hosts=allowed_hosts, trust_own_process=trust_own_process)
    ]
    app = limits.app(checks, _error, after=[_errors])
    app[_ENGINE] = engine
    app[_WEIGHTS_DIRS] = tuple(Path(d).resolve() for d in weights_dirs)
    app[_GENERATE_BUDGET] = Budget(bytes=max_body, values=GENERATE_VALUES, depth=None)
    app.add_routes(engine_routes())
    chat = None
    if getattr(getattr(engine, "tokenizer", None), "chat_template", None):
        chat = await chat_endpoint(engine, engine.tokenizer, pm=pm, tool_call_parser=tool_call_parser)  # type: ignore[attr-defined]
        add_chat_routes(app, chat)
    else:  # the chat routes say why they are absent, rather than a bare 404
        refusal = NO_CHAT_TEMPLATE.format(tokenizer=type(getattr(engine, "tokenizer", None)).__name__)

        async def no_chat(request: web.Request) -> web.Response:
            return _error(f"{request.path}: {refusal}", 404)

        app.add_routes([web.post(path, no_chat) for path in CHAT_PATHS])
    # a client that disconnects cancels its handler, which aborts its generation
    runner, bound_port = await limits.serve(app, host, port)
    handle = ServerHandle(host=host, port=bound_port, runner=runner, engine=engine, limits=limits, chat=chat)
    handle.share_token(token)
    if engine.url is None:  # an engine with a URL of its own (a client, served as a proxy) keeps it
        engine.url = handle.url
    return handle


def engine_routes() -> list[web.RouteDef]:
    """SGLang's native routes, as ``rlsdk serve`` answers them."""
    return [
        web.get("/health", _health),
        web.get("/health_generate", _health_generate),
        web.get("/model_info", _model_info),
        web.get("/get_model_info", _model_info),
        web.get("/get_weight_version", _weight_version_gone),
        web.get("/weight_version", _weight_version_gone),
        web.post("/generate", _generate),
        web.post("/abort_request", _abort),
        web.get("/v1/loads", _loads),
        web.route("*", "/flush_cache", _flush_cache),
        web.post("/pause_generation", _pause),
        web.post("/continue_generation", _continue),
        web.post("/update_weights_from_disk", _update_weights_from_disk),
        web.post("/load_lora_adapter", _load_lora_adapter),
        web.post("/unload_lora_adapter", _unload_lora_adapter),
        web.post("/update_weight_version", _update_weight_version),
        web.route("*", "/weights_checker", _weights_checker),
    ]


def _error(message: str, status: int) -> web.Response:
    return web.json_response(error_body(message, status), status=status)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Bad requests become SGLang's 4xx error body; nothing crashes the server."""
    try:
        return await handler(request)
    except EngineRequestError as exc:
        return _error(str(exc), 400)
    except TooCostly as exc:  # over the route's budget, before any work
        return _error(str(exc), exc.status)
    except NotImplementedError as exc:  # what this engine cannot do is the request's to learn, not a crash
        return _error(f"{request.path} is not supported by this engine: {exc}", 400)
    except web.HTTPException as exc:
        if exc.status == 404:
            return _error(f"no endpoint {request.method} {request.path}", 404)
        if exc.status == 405:
            return _error(f"{request.method} not allowed on {request.path}", 405)
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:  # an engine failure is a 500 with its message, not a dead server
        return _error(f"{type(exc).__name__}: {exc}", 500)


GENERATE_VALUES = 2 << 20
"""JSON values a ``/generate`` body may hold (token ids of a batch of long prompts): about 70 MiB as
Python objects at most."""


async def _json_body(
    request: web.Request, budget: Budget = SMALL, *, required: bool = True
) -> dict[str, Any]:
    """The request's JSON object, within the route's ``budget`` (:mod:`rlsdk.sizes`; 413 over it)."""
    raw = await request.read()
    if not raw.strip() and required:
        raise EngineRequestError("request body is empty: expected a JSON object")
    try:
        body = await parse_request(raw, budget)
    except NotJson as exc:
        raise EngineRequestError(str(exc)) from None
    if not isinstance(body, dict):
        raise EngineRequestError(f"request body must be a JSON object, got {type(body).__name__}")
    return body


def _text(body: dict[str, Any], key: str) -> str:
    """``body[key]``, a non-empty string (else :class:`EngineRequestError`, SGLang's 400)."""
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise EngineRequestError(f"{key} must be a non-empty string")
    return value


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _health_generate(request: web.Request) -> web.Response:
    engine = request.app[_ENGINE]
    await engine.generate({"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    return web.Response(status=200)


async def _model_info(request: web.Request) -> web.Response:
    return web.json_response(await request.app[_ENGINE].model_info())


async def _weight_version_gone(request: web.Request) -> web.Response:
    return _error(_WEIGHT_VERSION_GONE, 404)


async def _generate(request: web.Request) -> web.StreamResponse:
    engine = request.app[_ENGINE]
    body = _with_rids(await _json_body(request, request.app[_GENERATE_BUDGET]))
    if unknown := _unknown_adapter(engine, body):
        return unknown
    if not body.get("stream"):
        try:
            return web.json_response(await engine.generate(body))
        except asyncio.CancelledError:  # the client went away: stop generating for it
            await _abort_rids(engine, body)
            raise
    items = split_batch(body)
    chunks = (
        merge_streams([engine.generate_stream(item) for item in items])
        if items
        else (engine.generate_stream(body))
    )
    first = await anext(chunks, None)  # errors in the request surface here, before the 200 is sent
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    try:
        if first is not None:
            await response.write(_event(first))
            async for chunk in chunks:
                await response.write(_event(chunk))
        await response.write(b"data: [DONE]\n\n")
    except (ConnectionResetError, asyncio.CancelledError) as exc:  # the client went away
        await chunks.aclose()  # type: ignore[attr-defined]  # an async generator's, which the engine's stream is
        await _abort_rids(engine, body)
        if isinstance(exc, asyncio.CancelledError):
            raise
    return response


def _with_rids(body: dict[str, Any]) -> dict[str, Any]:
    """The request with a ``rid`` for every prompt, so that it can be aborted when its client goes away."""
    if body.get("rid") is not None:
        return body
    items = split_batch(body)
    return {**body, "rid": [new_rid() for _ in items] if items is not None else new_rid()}


async def _abort_rids(engine: InferenceEngine, body: dict[str, Any]) -> None:
    rids = body.get("rid")
    for rid in rids if isinstance(rids, list) else [rids]:
        if isinstance(rid, str):
            await engine.abort(rid)


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


async def _abort(request: web.Request) -> web.Response:
    body = await _json_body(request, required=False)
    rid = body.get("rid")
    if body.get("abort_all") or not rid:
        await request.app[_ENGINE].abort(None)
    else:
        for one in rid if isinstance(rid, list) else [rid]:
            await request.app[_ENGINE].abort(str(one))
    return web.Response(status=200)


async def _loads(request: web.Request) -> web.Response:
    load = await request.app[_ENGINE].load()
    entry = {"timestamp": time.time(), "dp_rank": 0, **load}
    return web.json_response(
        {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
            "version": f"rlsdk {__version__}",
            "loads": [entry],
        }
    )


async def _flush_cache(request: web.Request) -> web.Response:
    if request.method not in ("GET", "POST"):
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])
    flushed = await request.app[_ENGINE].flush_cache()
    return web.Response(text=_FLUSH_TEXT, status=200 if flushed else 400)


async def _pause(request: web.Request) -> web.Response:
    body = await _json_body(request, required=False)
    mode = body.get("mode", "abort")
    if mode not in ("abort", "in_place", "retract"):
        raise EngineRequestError(f"mode must be abort, in_place or retract, got {mode!r}")
    await request.app[_ENGINE].pause(mode)
    return web.json_response({"message": "Generation paused successfully.", "status": "ok"})


async def _continue(request: web.Request) -> web.Response:
    await request.app[_ENGINE].resume()
    return web.json_response({"message": "Generation continued successfully.", "status": "ok"})


def _outside_weights_dirs(request: web.Request, path: str, *parts: str) -> str | None:
    """Why ``path`` (and each of its files ``parts``, links resolved) may not be read, or None when every one
    lies inside an operator-allowed folder."""
    allowed = request.app[_WEIGHTS_DIRS]
    if not allowed:
        return "loading weights over HTTP is off (start rlsdk serve with --allow-weights-dir FOLDER)"
    for candidate in (Path(path), *(Path(path) / part for part in parts)):
        if not any(candidate.resolve().is_relative_to(folder) for folder in allowed):
            return (
                f"{str(candidate)[:200]!r} is not inside {', '.join(map(str, allowed))} "
                "(start rlsdk serve with --allow-weights-dir FOLDER)"
            )
    return None


async def _update_weights_from_disk(request: web.Request) -> web.Response:
    body = await _json_body(request)
    model_path = _text(body, "model_path")
    if why := _outside_weights_dirs(request, model_path):
        message = f"Failed to update weights: {why}"
        return web.json_response({"success": False, "message": message, "num_paused_requests": 0}, status=403)
    version = body.get("weight_version")
    try:
        await request.app[_ENGINE].update_weights_from_disk(
            model_path, None if version is None else str(version)
        )
    except (OSError, ValueError, RuntimeError, NotImplementedError) as exc:
        return web.json_response(
            {"success": False, "message": f"Failed to update weights: {exc}", "num_paused_requests": 0},
            status=400,
        )
    return web.json_response(
        {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
    )


def _lora_answer(
    engine: InferenceEngine, error: str | None = None, status: int = 400, *, unloading: bool = False
) -> web.Response:
    """SGLang 0.5.17's answer to a LoRA call (``tests/fixtures/sglang-0.5.17-lora.json``): ``rid`` and
    ``http_worker_ipc`` (null), ``success``, ``error_message`` (empty on success), ``loaded_adapters``
    (name -> path; null when an unload failed, as SGLang sends it)."""
    loaded = None if error is not None and unloading else _loaded_adapters(engine)
    body = {"rid": None, "http_worker_ipc": None, "success": error is None, "error_message": error or "",
            "loaded_adapters": loaded}  # fmt: skip
    return web.json_response(body, status=200 if error is None else status)


def _loaded_adapters(engine: InferenceEngine) -> dict[str, str]:
    return dict(getattr(engine, "lora_adapters", {}))


def _unknown_adapter(engine: InferenceEngine, body: dict[str, Any]) -> web.Response | None:
    """SGLang's 400 for a ``/generate`` that names an adapter not loaded (a ``lora_path`` string, or one per
    prompt), before anything is generated; None when every name is loaded, or the engine keeps no list of
    its adapters (an SGLang behind it checks the names itself)."""
    named, loaded = body.get("lora_path"), getattr(engine, "lora_adapters", None)
    if named is None or loaded is None:
        return None
    for name in named if isinstance(named, list) else [named]:
        if isinstance(name, str) and name not in loaded:
            message = (
                f"Got LoRA adapter that has never been loaded: {name}\n"
                f"All loaded adapters: dict_keys({list(loaded)!r})."
            )
            return web.json_response({"error": {"message": message}}, status=400)
    return None


async def _load_lora_adapter(request: web.Request) -> web.Response:
    """Load a PEFT adapter folder by path, only from inside the operator's ``weights_dirs`` (its two files
    too, links resolved): a request never makes the server open anything else."""
    body = await _json_body(request)
    name, path = _text(body, "lora_name"), _text(body, "lora_path")
    engine = request.app[_ENGINE]
    if why := _outside_weights_dirs(request, path, ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        return _lora_answer(engine, f"Failed to load LoRA adapter {name!r}: {why}", status=403)
    try:
        await engine.load_lora_adapter(name, path)
    except (OSError, ValueError, RuntimeError, NotImplementedError, EngineRequestError) as exc:
        return _lora_answer(engine, f"Failed to load LoRA adapter {name!r}: {exc}")
    return _lora_answer(engine)


async def _unload_lora_adapter(request: web.Request) -> web.Response:
    name = _text(await _json_body(request), "lora_name")
    engine = request.app[_ENGINE]
    try:
        await engine.unload_lora_adapter(name)
    except (ValueError, RuntimeError, NotImplementedError, EngineRequestError) as exc:
        return _lora_answer(engine, f"Failed to unload LoRA adapter {name!r}: {exc}", unloading=True)
    return _lora_answer(engine)


async def _update_weight_version(request: web.Request) -> web.Response:
    version = _text(await _json_body(request), "new_version")
    await request.app[_ENGINE].update_weight_version(version)
    return web.json_response(
        {"success": True, "message": f"Weight version updated to {version}", "new_version": version}
    )


async def _weights_checker(request: web.Request) -> web.Response:
    """SGLang's ``/weights_checker``: ``checksum`` (the default action) only; ``snapshot``, ``reset_tensors``
    and ``compare`` copy or overwrite the served weights and are refused."""
    if request.method not in ("GET", "POST"):
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])
    body = await _json_body(request, required=False)
    action = body.get("action", "checksum")
    if action != "checksum":
        message = f"Unsupported action={str(action)[:50]!r}: rlsdk serve answers 'checksum' only"
        return web.json_response({"success": False, "message": message}, status=400)
    served = await request.app[_ENGINE].weight_checksums()
    if not served:
        message = f"{type(request.app[_ENGINE]).__name__} reports no weight checksums"
        return web.json_response({"success": False, "message": message}, status=400)
    return web.json_response(sglang_answer([holder.checksums for holder in served]))
