"""The rules both HTTP services (``rlsdk serve`` and ``rlsdk buffer serve``) apply before any work.

- Loopback by default; bound anywhere else a bearer token is required (:func:`check_binding`).
- With a token, every request must carry ``Authorization: Bearer <token>``, compared in constant time.
- Requests from web pages are refused: a page can make a browser send a cross-site POST (a form post as
  ``text/plain``, ``application/x-www-form-urlencoded`` or ``multipart/form-data``, or a body-less
  ``fetch``) without asking the server first, but not a JSON one, and the browser always names the page in
  ``Origin``. So a request whose ``Origin`` is not the service itself gets 403, and a ``Content-Type``
  other than JSON gets 415 (programs that send none, as some slime-style clients do, are served).
- Slow and idle clients cannot pile up (:class:`ConnectionLimits`).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ErrorReply = Callable[[str, int], web.Response]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_binding(service: str, host: str, token: str | None, token_env: str) -> None:
    """Refuse to serve off loopback without a bearer token (ValueError naming the option and variable)."""
    if not is_loopback(host) and not token:
        raise ValueError(f"binding {service} to {host} needs a bearer token (--token or ${token_env})")


def token_matches(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <token>``, compared in constant time."""
    return hmac.compare_digest((authorization or "").encode(), f"Bearer {token}".encode())


def is_json(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` header names JSON (parameters such as ``charset`` allowed)."""
    return (content_type or "").split(";")[0].strip().lower() == "application/json"


def guard(token: str | None, error: ErrorReply) -> Any:
    """An aiohttp middleware that answers 401 without the token, 403 to a web page of another origin and
    415 for a body that is not JSON; ``error(message, status)`` builds the service's own error body."""

    @web.middleware
    async def guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
        if token and not token_matches(request.headers.get("Authorization"), token):
            return error("missing or wrong bearer token (Authorization: Bearer <token>)", 401)
        origin = request.headers.get("Origin")
        if origin is not None and origin.partition("://")[2] != request.host:
            return error(f"requests from web pages are refused (Origin: {origin[:100]})", 403)
        content_type = request.headers.get("Content-Type")
        if content_type and not is_json(content_type):
            return error(f"Content-Type must be application/json, got {content_type!r:.100}", 415)
        return await handler(request)

    return guarded


class ConnectionLimits:
    """Slow, idle and oversized requests cannot pile up: at most ``max_connections`` open connections
    (more are answered 503 and closed), a connection that is not in a request for ``idle_timeout`` seconds
    (a client that sends its request slowly, or half-open) is closed, and a request body must be at most
    ``max_body`` bytes (413, before reading when its length is declared) and arrive within
    ``read_timeout`` seconds (408). Use :meth:`middleware` in the app, then :meth:`listen`."""

    def __init__(
        self, *, max_body: int, read_timeout: float, idle_timeout: float, max_connections: int
    ) -> None:
        self.max_body, self.max_connections = max_body, max_connections
        self.read_timeout, self.idle_timeout = read_timeout, idle_timeout
        self._busy: dict[Any, int] = {}  # transport -> requests in progress
        self._last_seen: dict[Any, float] = {}  # transport -> when it connected or last finished a request
        self._server: asyncio.base_events.Server | None = None
        self._watchdog: asyncio.Task[None] | None = None

    def middleware(self, error: ErrorReply) -> Any:
        """Tracks requests in progress; reads the body (aiohttp keeps it for the handler) under the limits.
        The app's ``client_max_size`` must be ``max_body``."""

        @web.middleware
        async def limited(request: web.Request, handler: Handler) -> web.StreamResponse:
            transport = request.transport
            self._busy[transport] = self._busy.get(transport, 0) + 1
            try:
                if (request.content_length or 0) > self.max_body:
                    return error(
                        f"request body of {request.content_length} bytes is over the "
                        f"{self.max_body}-byte limit",
                        413,
                    )
                if request.can_read_body:
                    try:
                        async with asyncio.timeout(self.read_timeout):
                            await request.read()
                    except TimeoutError:
                        return error(f"request body not received within {self.read_timeout:g}s", 408)
                    except web.HTTPRequestEntityTooLarge:
                        return error(f"request body is over the {self.max_body}-byte limit", 413)
                return await handler(request)
            finally:
                self._busy[transport] -= 1
                self._last_seen[transport] = time.monotonic()

        return limited

    async def listen(self, runner: web.AppRunner, host: str, port: int) -> int:
        """Serve ``runner`` (set up) on ``host:port``; the port bound."""
        handlers = runner.server
        assert handlers is not None, "runner.setup() first"

        def connection() -> asyncio.Protocol:
            return _Refuse() if len(handlers.connections) >= self.max_connections else handlers()

        self._server = await asyncio.get_running_loop().create_server(connection, host, port)
        self._watchdog = asyncio.create_task(self._close_idle(handlers))
        return self._server.sockets[0].getsockname()[1]

    async def _close_idle(self, handlers: web.Server) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.idle_timeout / 4))
            now = time.monotonic()
            for handler in list(handlers.connections):
                transport = handler.transport
                if transport is None:
                    continue
                since = self._last_seen.setdefault(transport, now)
                if not self._busy.get(transport) and now - since > self.idle_timeout:
                    transport.close()
            for transport in [t for t in self._last_seen if t.is_closing()]:
                self._last_seen.pop(transport, None)
                self._busy.pop(transport, None)

    def close(self) -> None:
        """Stop listening (then ``await runner.cleanup()`` closes the open connections)."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._server is not None:
            self._server.close()


_TOO_MANY = b'{"success": false, "message": "too many open connections; try again later"}'


class _Refuse(asyncio.Protocol):
    """A connection over the limit: answered 503 and closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        head = (
            f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
            f"Content-Length: {len(_TOO_MANY)}\r\n\r\n"
        )
        transport.write(head.encode() + _TOO_MANY)  # type: ignore[attr-defined]
        transport.close()
