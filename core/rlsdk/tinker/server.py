"""The Tinker API over HTTP (aiohttp): the routes the pinned ``tinker`` SDK calls, under ``/api/v1/``.

Every request passes rlsdk's service guard first (:mod:`rlsdk.engines.service_guard`): loopback by default,
the ``Host`` allowlist, web pages refused, bodies JSON or (``forward_backward``) protobuf, sizes bounded, and
an API key in ``X-API-Key`` (the SDK's header; its ``tml-`` keys) compared in constant time. A body that does
not fit the SDK's schema is a 400 naming the field; an id this key may not see is a 404."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ..engines.service_guard import ConnectionLimits, Served, check_binding, guard, media_type
from ..sizes import Budget, NotJson, TooCostly, parse_request
from .futures import LONG_POLL_SECONDS, UserError
from .service import Gone, NotFound, TinkerService
from .wire import WireError, parse_json, read_forward_backward

log = logging.getLogger(__name__)

API_KEY_ENV = "RLSDK_TINKER_API_KEY"
"""Environment variable holding the API key the server requires (``--api-key``)."""
PROTOBUF = "application/x-protobuf"
MAX_BODY = 64 * 1024 * 1024
"""Largest request body, in bytes (the SDK cuts a batch into chunks of about 5 MB)."""
MAX_DECOMPRESSED = 4 * MAX_BODY
_SERVICE = web.AppKey("service", TinkerService)
_OWNERS = web.AppKey("owners", dict)
_SIGNER = web.AppKey("signer", object)
FILES = "/api/v1/files/"
"""Downloads of external weights' files, by signed URL (``get_external_weights_urls``) rather than API key."""
URL_SECONDS = 3600


class Signer:
    """Signed download URLs: an HMAC of the file's path and the expiry under a secret of this server."""

    def __init__(self) -> None:
        self.secret = secrets.token_bytes(32)

    def signature(self, path: str, expires: int) -> str:
        return hmac.new(self.secret, f"{path}|{expires}".encode(), hashlib.sha256).hexdigest()

    def sign(self, origin: str, path: str) -> str:
        expires = int(time.time()) + URL_SECONDS
        return f"{origin}{FILES}{path}?expires={expires}&signature={self.signature(path, expires)}"

    def valid(self, request: web.Request) -> bool:
        path = request.path.removeprefix(FILES)
        try:
            expires = int(request.query.get("expires", ""))
        except ValueError:
            return False
        given = request.query.get("signature", "")
        return expires > time.time() and hmac.compare_digest(given, self.signature(path, expires))


CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,  # the API key itself on every request; no JWT exchange
    "proto_compress_fwdbwd": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,  # forward_backward_custom runs the loss in the client (on cross_entropy)
    "sample_join_sampling_session": False,
}
"""The feature flags ``/api/v1/client/config`` answers (the SDK's defaults otherwise)."""


def owner_of(key: str) -> str:
    """The owner id of an API key: a digest, so the key itself is never stored with what it owns."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def check_api_key(key: str) -> str:
    """A key the SDK will send: ``tml-`` and at least 16 characters (the SDK refuses other forms)."""
    if not key.startswith("tml-"):
        raise ValueError(
            f"the API key must start with 'tml-' (the Tinker SDK sends no other form; ${API_KEY_ENV})"
        )
    return key


def _reply(message: str, status: int) -> web.Response:
    return web.json_response({"detail": message}, status=status)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except (WireError, UserError) as exc:
        return _reply(str(exc), 400)
    except TooCostly as exc:
        return _reply(str(exc), exc.status)
    except NotFound as exc:
        return _reply(str(exc), 404)
    except Gone as exc:
        return _reply(str(exc), 410)
    except web.HTTPException as exc:
        if exc.status in (404, 405):
            return _reply(f"no endpoint {request.method} {request.path}", exc.status)
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:  # a failure is a 500 with its message, never a dead server
        log.exception("%s %s failed", request.method, request.path)
        return _reply(f"{type(exc).__name__}: {exc}", 500)


def _owner(request: web.Request) -> str:
    return request.app[_OWNERS][request.headers["X-API-Key"]]  # the guard let only known keys through


JSON_BUDGET = Budget(bytes=MAX_BODY, values=2 << 20)
"""What a JSON body may cost before it is parsed (:mod:`rlsdk.sizes`): token ids of a long prompt and more."""


async def _json(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return await parse_request(raw, JSON_BUDGET)  # 413 over it (TooCostly), before it is parsed
    except NotJson as exc:
        raise WireError(f"body: not JSON ({exc})") from None


Handler = Callable[[TinkerService, str, Any, web.Request], Awaitable[Any]]


def _route(model: Any = None) -> Callable[[Handler], Callable[[web.Request], Awaitable[web.StreamResponse]]]:
    """An aiohttp handler around ``fn(service, owner, body, request)``: the JSON body validated as the SDK's
    ``model`` (raw JSON without one); the result answered as JSON (nothing: an empty object)."""

    def wrap(fn: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        @functools.wraps(fn)
        async def handler(request: web.Request) -> web.StreamResponse:
            body = await _json(request) if request.method in ("POST", "PUT") else None
            if model is not None:
                body = parse_json(model, body)
            result = await fn(request.app[_SERVICE], _owner(request), body, request)
            return result if isinstance(result, web.StreamResponse) else web.json_response(result or {})

        return handler

    return wrap


def _posts(*handlers: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> list[web.RouteDef]:
    """``POST /api/v1/NAME`` for each handler, NAME its function's name."""
    return [web.post(f"/api/v1/{handler.__name__}", handler) for handler in handlers]


def _future(request_id: str, model_id: str | None = None) -> dict[str, Any]:
    return {"request_id": request_id, "model_id": model_id}


def _page(request: web.Request, default: int = 20) -> tuple[int, int]:
    try:
        limit = int(request.query.get("limit", default))
        offset = int(request.query.get("offset", 0))
    except ValueError:
        raise WireError("limit and offset: integers") from None
    if not 1 <= limit <= 1000 or offset < 0:
        raise WireError("limit: 1 to 1000; offset: 0 or more")
    return limit, offset


def build_routes(flags: dict[str, Any]) -> list[web.RouteDef]:
    """Every route of the Tinker API, its handlers reading their bodies with the pinned SDK's types."""
    from tinker import types

    return [
        *_session_routes(flags, types),
        *_model_routes(types),
        *_sampling_routes(types),
        *_checkpoint_routes(types),
    ]


def _checkpoint_id(request: web.Request) -> tuple[str, str]:
    match = request.match_info
    return match["run_id"], f"{match['segment']}/{match['name']}"


def _session_routes(flags: dict[str, Any], types: Any) -> list[web.RouteDef]:
    """The client's configuration, health, telemetry and sessions."""

    @_route(types.ClientConfigRequest)
    async def client_config(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return flags

    @_route(types.ClientConfigRequest)
    async def dynamic_config(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return {}

    @_route()
    async def healthz(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return {"status": "ok"}

    @_route()
    async def capabilities(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return service.capabilities()

    @_route()
    async def telemetry(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return {"status": "accepted"}  # the SDK's own diagnostics: nothing to keep here

    @_route(types.CreateSessionRequest)
    async def create_session(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return service.create_session(owner, body)

    @_route(types.SessionHeartbeatRequest)
    async def heartbeat(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return service.heartbeat(owner, body.session_id)

    @_route()
    async def finish(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        service.finish(owner, request.match_info["session_id"], body)

    @_route()
    async def list_sessions(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return service.list_sessions(owner, *_page(request))

    @_route(types.SessionSearchRequest)
    async def search_sessions(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return await asyncio.to_thread(service.search_sessions, owner, body)

    @_route()
    async def get_session(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return service.session_info(owner, request.match_info["session_id"])

    @_route()
    async def storage_usage(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return await asyncio.to_thread(service.storage_usage, owner)

    return [
        web.post("/api/v1/client/config", client_config),
        web.post("/api/v1/client/dynamic_config", dynamic_config),
        web.get("/api/v1/healthz", healthz),
        web.get("/api/v1/get_server_capabilities", capabilities),
        web.post("/api/v1/telemetry", telemetry),
        web.post("/api/v1/create_session", create_session),
        web.post("/api/v1/session_heartbeat", heartbeat),
        web.post("/api/v1/sessions/{session_id}/finish", finish),
        web.get("/api/v1/sessions", list_sessions),
        web.post("/api/v1/sessions/search", search_sessions),
        web.get("/api/v1/sessions/{session_id}", get_session),
        web.get("/api/v1/billing/usage/checkpoints/current", storage_usage),
    ]


def _model_routes(types: Any) -> list[web.RouteDef]:
    """Models: created, trained (forward_backward, optim_step), their weights saved and loaded."""

    @_route(types.CreateModelRequest)
    async def create_model(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return _future(service.create_model(owner, body))

    @_route(types.GetInfoRequest)
    async def get_info(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return service.get_info(owner, body.model_id)

    async def forward_backward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if media_type(request.headers.get("Content-Type")) != PROTOBUF:
            raise WireError(f"forward_backward takes a protobuf body ({PROTOBUF})")
        if request.headers.get("Content-Encoding", "").lower() == "zstd":
            body = _unzstd(body)
        parsed = await asyncio.to_thread(read_forward_backward, body)
        service = request.app[_SERVICE]
        return web.json_response(_future(service.forward_backward(_owner(request), parsed), parsed.model_id))

    @_route(types.OptimStepRequest)
    async def optim_step(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return _future(service.optim_step(owner, body), body.model_id)

    @_route(types.SaveWeightsRequest)
    async def save_weights(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return _future(service.save_state(owner, body), body.model_id)

    @_route(types.SaveWeightsForSamplerRequest)
    async def save_weights_for_sampler(
        service: TinkerService, owner: str, body: Any, request: web.Request
    ) -> Any:
        return _future(service.save_for_sampler(owner, body), body.model_id)

    @_route(types.SaveWeightsExternalRequest)
    async def save_weights_external(
        service: TinkerService, owner: str, body: Any, request: web.Request
    ) -> Any:
        return _future(service.save_external(owner, body), body.model_id)

    @_route(types.LoadWeightsRequest)
    async def load_weights(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return _future(service.load_weights(owner, body), body.model_id)

    return _posts(
        create_model,
        get_info,
        forward_backward,
        optim_step,
        save_weights,
        save_weights_for_sampler,
        save_weights_external,
        load_weights,
    )


def _sampling_routes(types: Any) -> list[web.RouteDef]:
    """Sampling sessions, samples, and the futures every long call answers with."""

    @_route(types.CreateSamplingSessionRequest)
    async def create_sampling_session(
        service: TinkerService, owner: str, body: Any, request: web.Request
    ) -> Any:
        return await service.create_sampling_session(owner, body)

    @_route(types.SampleRequest)
    async def asample(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return service.asample(owner, body)

    @_route(types.FutureRetrieveRequest)
    async def retrieve_future(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        entry = service.futures.get(owner, body.request_id)
        if entry is None:
            raise NotFound(f"no request {body.request_id[:80]!r}")
        if not await service.futures.wait(entry, LONG_POLL_SECONDS):
            return {"type": "try_again", "request_id": body.request_id, "queue_state": "active"}
        error = entry.future.exception()
        if error is not None:
            category = "user" if isinstance(error, (UserError, WireError)) else "server"
            return {
                "error": f"{type(error).__name__}: {error}" if category == "server" else str(error),
                "category": category,
            }
        result = entry.future.result()
        if isinstance(result, bytes):
            return web.Response(body=result, content_type=PROTOBUF)
        return result

    @_route()
    async def cancel_future(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return None  # samples finish quickly here; a result nobody retrieves expires

    @_route()
    async def get_sampler(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return service.get_sampler(owner, request.match_info["sampler_id"])

    return [
        *_posts(create_sampling_session, asample, retrieve_future, cancel_future),
        web.get("/api/v1/samplers/{sampler_id}", get_sampler),
    ]


def _checkpoint_routes(types: Any) -> list[web.RouteDef]:
    """Training runs and their checkpoints: listed, deleted, published, downloaded."""
    checkpoint = "/api/v1/training_runs/{run_id}/checkpoints/{segment}/{name}"

    @_route()
    async def training_runs(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return service.training_runs(owner, *_page(request))

    @_route()
    async def training_run(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return await asyncio.to_thread(service.training_run, owner, request.match_info["run_id"])

    @_route()
    async def checkpoints(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return await asyncio.to_thread(service.checkpoints, owner, request.match_info["run_id"])

    @_route()
    async def user_checkpoints(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        return await asyncio.to_thread(service.user_checkpoints, owner, *_page(request, 100))

    @_route()
    async def delete_checkpoint(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        await asyncio.to_thread(service.delete_checkpoint, owner, *_checkpoint_id(request))

    @_route()
    async def publish(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        service.publish(owner, *_checkpoint_id(request), public=request.method == "POST")

    @_route()
    async def set_ttl(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        ttl = body.get("ttl_seconds") if isinstance(body, dict) else None
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int)):
            raise WireError("ttl_seconds: an integer or null")
        service.set_ttl(owner, *_checkpoint_id(request), ttl)

    @_route()
    async def external_urls(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        run_id, checkpoint_id = _checkpoint_id(request)
        files = await asyncio.to_thread(service.external_files, owner, run_id, checkpoint_id)
        signer = request.app[_SIGNER]
        assert isinstance(signer, Signer)
        origin = f"{request.scheme}://{request.host}"
        urls = {name: signer.sign(origin, f"{run_id}/{checkpoint_id}/{name}") for name in files}
        expires = time.time() + URL_SECONDS
        return {"urls": urls, "expires": _iso_time(expires)}

    async def download(request: web.Request) -> web.StreamResponse:
        match = request.match_info  # the guard checked the signature
        path = request.app[_SERVICE].external_file(
            match["run_id"], f"{match['segment']}/{match['name']}", match["file"]
        )
        return web.FileResponse(path)

    @_route()
    async def weights_info(service: TinkerService, owner: str, body: Any, request: web.Request) -> Any:
        path = body.get("tinker_path") if isinstance(body, dict) else None
        if not isinstance(path, str):
            raise WireError("tinker_path: a tinker:// path")
        return service.weights_info(owner, path)

    return [
        web.get("/api/v1/training_runs", training_runs),
        web.get("/api/v1/training_runs/{run_id}", training_run),
        web.get("/api/v1/training_runs/{run_id}/checkpoints", checkpoints),
        web.delete(checkpoint, delete_checkpoint),
        web.post(checkpoint + "/publish", publish),
        web.delete(checkpoint + "/publish", publish),
        web.put(checkpoint + "/ttl", set_ttl),
        web.get(checkpoint + "/external_weights_urls", external_urls),
        web.get(FILES + "{run_id}/{segment}/{name}/{file:.+}", download),
        web.get("/api/v1/checkpoints", user_checkpoints),
        web.post("/api/v1/weights_info", weights_info),
    ]


def _iso_time(seconds: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(seconds, UTC).isoformat()


def _unzstd(body: bytes) -> bytes:
    import zstandard

    try:
        with zstandard.ZstdDecompressor().stream_reader(body) as reader:
            out = reader.read(MAX_DECOMPRESSED + 1)
    except zstandard.ZstdError as exc:
        raise WireError(f"body: not zstd data ({exc})") from None
    if len(out) > MAX_DECOMPRESSED:
        raise WireError(f"body: decompresses to more than {MAX_DECOMPRESSED} bytes")
    return out


@dataclass
class TinkerServer(Served):
    """A running :func:`start_tinker_server`; ``await close()`` stops it and its service."""

    service: TinkerService

    async def close(self) -> None:
        await super().close()
        await self.service.close()


class ServerThread:
    """:func:`start_tinker_server` on a thread and event loop of its own, for a client in the same process
    (the SDK runs its own loop): tests, the compatibility report, benchmarks. ``with ServerThread(...) as url``."""

    def __init__(self, service: TinkerService, api_keys: Sequence[str], **options: Any) -> None:
        self.service, self.api_keys, self.options = service, api_keys, options
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="tinker-server", daemon=True)
        self.server: TinkerServer | None = None

    def __enter__(self) -> str:
        self.thread.start()
        start = start_tinker_server(self.service, self.api_keys, **self.options)
        try:
            self.server = asyncio.run_coroutine_threadsafe(start, self.loop).result()
        except BaseException:
            self.__exit__()
            raise
        return self.server.url

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=60)
        self.loop.close()


async def start_tinker_server(
    service: TinkerService,
    api_keys: Sequence[str],
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    allowed_hosts: Sequence[str] = (),
    max_connections: int = 1024,
    client_config: dict[str, Any] | None = None,
) -> TinkerServer:
    """Start ``service`` (its engines) and serve it on ``host:port`` (0: a free port). ``client_config``:
    SDK flags to answer besides :data:`CLIENT_CONFIG` (e.g. ``fwdbwd_max_chunk_len``)."""
    if not api_keys:
        raise ValueError(f"the Tinker API needs an API key (--api-key or ${API_KEY_ENV})")
    for key in api_keys:
        check_binding("rlsdk tinker serve", host, check_api_key(key), API_KEY_ENV)
    owners = {key: owner_of(key) for key in api_keys}

    signer = Signer()

    def authorized(request: web.Request) -> bool:
        if request.path.startswith(FILES) and request.method == "GET":
            return signer.valid(request)
        given = request.headers.get("X-API-Key", "").encode()
        return any(hmac.compare_digest(given, key.encode()) for key in owners)  # every key compared

    limits = ConnectionLimits(max_body=MAX_BODY, max_connections=max_connections)
    app = limits.app(
        [
            guard(
                None,
                _reply,
                bind_host=host,
                allowed_hosts=allowed_hosts,
                authorized=authorized,
                credentials="API key (X-API-Key: tml-..., the client's TINKER_API_KEY)",
                body_types=("application/json", PROTOBUF),
            )
        ],
        _reply,
        after=[_errors],
    )
    app[_SERVICE] = service
    app[_OWNERS] = owners
    app[_SIGNER] = signer
    app.add_routes(build_routes({**CLIENT_CONFIG, **(client_config or {})}))
    await service.start()
    try:
        runner, bound = await limits.serve(app, host, port)
    except BaseException:
        await service.close()
        raise
    return TinkerServer(host, bound, runner, limits, service)
