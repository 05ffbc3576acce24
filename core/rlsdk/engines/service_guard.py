"""The rules both HTTP services (``rlsdk serve`` and ``rlsdk buffer serve``) apply before any work.

- Loopback by default; bound anywhere else a bearer token is required (:func:`check_binding`).
- With a token, every request must carry ``Authorization: Bearer <token>``, compared in constant time.
- DNS rebinding is refused: a page of ``evil.example`` whose name the attacker re-points at 127.0.0.1 is
  same-origin with the service in the browser's eyes, but its requests carry ``Host: evil.example``. So a
  service bound to loopback answers only a ``Host`` that is a loopback name (``localhost``, ``127.x``,
  ``[::1]``, any port) or one the operator allowed (``--allowed-host``); 421 otherwise (:func:`host_allowed`).
- Requests from web pages are refused: a page can make a browser send a cross-site POST (a form post as
  ``text/plain``, ``application/x-www-form-urlencoded`` or ``multipart/form-data``, or a body-less
  ``fetch``) without asking the server first, but not a JSON one, and the browser always names the page in
  ``Origin``. So a request whose ``Origin`` is not a loopback name or an allowed host gets 403 (never
  compared with ``Host``, which the page controls), and a ``Content-Type`` other than JSON gets 415
  (programs that send none, as some slime-style clients do, are served).
- Slow and idle clients cannot pile up, and idle strangers hold no connection slot (:class:`ConnectionLimits`).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from . import run_tokens

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ErrorReply = Callable[[str, int], web.Response]
READ_TIMEOUT = 60.0
"""Seconds a request body may take to arrive (408 after), unless a service sets its own."""
IDLE_TIMEOUT = 300.0
"""Seconds a connection may stay out of a request (sending one slowly, or idle) before it is closed."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address, without port or brackets) is this machine's loopback."""
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):  # RFC 6761: never resolved by DNS
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def hostname(value: str) -> str | None:
    """The host name of a ``Host`` header (``name:port``, ``[::1]:port``) or an ``Origin``
    (``scheme://name:port``), lower case; None when there is none to read."""
    try:
        name = urlsplit(value if "://" in value else "//" + value).hostname
    except ValueError:
        return None
    return name.rstrip(".") if name else None


def normalize_hosts(hosts: Iterable[str]) -> frozenset[str]:
    """Operator-allowed host names (``--allowed-host``), as :func:`hostname` reads them; ``*`` is any."""
    return frozenset(h if h == "*" else hostname(h.strip()) or h.strip().lower() for h in hosts if h.strip())


def host_allowed(value: str | None, allowed: frozenset[str]) -> bool:
    """Whether a ``Host`` or ``Origin`` value names a loopback host or one in ``allowed``."""
    if "*" in allowed:
        return True
    name = hostname(value or "")
    return name is not None and (is_loopback(name) or name in allowed)


MIN_TOKEN_CHARS = 16
"""A bearer token shorter than this is refused: a one-character token is guessed at once (S2)."""
FAILED_AUTH_PER_SECOND = 20.0
"""Wrong-token requests a service answers per second, over all its connections together (S2)."""


def check_binding(service: str, host: str, token: str | None, token_env: str) -> None:
    """Refuse to serve off loopback without a bearer token, or with one too short to be a secret
    (ValueError naming the option and variable)."""
    if not is_loopback(host) and not token:
        raise ValueError(f"binding {service} to {host} needs a bearer token (--token or ${token_env})")
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise ValueError(
            f"the bearer token of {service} (--token or ${token_env}) has {len(token)} characters, fewer "
            f"than {MIN_TOKEN_CHARS}: use a random one, e.g. python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'"
        )


class FailedAuthLimiter:
    """Slows wrong-token guesses down to ``rate`` a second for the whole service, however many
    connections they come on: :meth:`delay` is how long the next refusal waits (a leaky bucket of
    ``burst`` refusals)."""

    def __init__(
        self,
        rate: float = FAILED_AUTH_PER_SECOND,
        burst: int = 10,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self._free_at = 0.0  # when the bucket is empty again

    def delay(self) -> float:
        now = self.clock()
        self._free_at = max(self._free_at, now) + 1.0 / self.rate
        return max(0.0, self._free_at - now - self.burst / self.rate)


def token_matches(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <token>``, compared in constant time."""
    return hmac.compare_digest((authorization or "").encode(), f"Bearer {token}".encode())


def media_type(content_type: str | None) -> str:
    """A ``Content-Type`` header's media type, lower case, without parameters such as ``charset``."""
    return (content_type or "").split(";")[0].strip().lower()


def peer_in_this_process(transport: Any) -> bool:
    """Whether the client end of a loopback TCP connection is a socket of this very process (Linux: its
    inode in ``/proc/net/tcp`` is one of ``/proc/self/fd``); False wherever that cannot be told."""
    peer, local = transport.get_extra_info("peername"), transport.get_extra_info("sockname")
    if not peer or not local or len(peer) != 2:  # IPv4 only: the run's servers bind 127.0.0.1
        return False
    try:

        def address(host: str, port: int) -> str:
            return f"{socket.inet_aton(host)[::-1].hex().upper()}:{port:04X}"

        wanted = (address(*peer), address(*local))
        inode = None
        with open("/proc/net/tcp") as table:
            for line in table:
                fields = line.split()
                if len(fields) > 9 and (fields[1], fields[2]) == wanted:
                    inode = fields[9]
                    break
        if inode is None:
            return False
        target = f"socket:[{inode}]"
        return any(os.readlink(f"/proc/self/fd/{fd}") == target for fd in os.listdir("/proc/self/fd"))
    except OSError:
        return False


def guard(
    token: str | None,
    error: ErrorReply,
    *,
    bind_host: str = "127.0.0.1",
    allowed_hosts: Iterable[str] = (),
    trust_own_process: bool = False,
    authorized: Callable[[web.Request], bool] | None = None,
    credentials: str = "bearer token (Authorization: Bearer <token>)",
    body_types: Iterable[str] = ("application/json",),
) -> Any:
    """An aiohttp middleware that answers 421 to a ``Host`` that is neither loopback nor in
    ``allowed_hosts`` (DNS rebinding; checked when ``bind_host`` is loopback or hosts are allowed: off
    loopback the token is the boundary), 401 without the token, 403 to a web page whose ``Origin`` is neither
    loopback nor allowed, and 415 for a body that is not JSON (or another of ``body_types``); ``error(message,
    status)`` builds the service's own error body. With ``trust_own_process`` (a server a run starts for
    itself) a request from this very process needs no token (the run's generators, slime-style code posting
    with its own HTTP client included); every other process does. ``authorized(request)``, when given,
    checks the credentials in place of the bearer ``token`` (a service whose clients send another header,
    named in the 401's message by ``credentials``)."""
    types = frozenset(body_types)
    allowed = normalize_hosts(allowed_hosts)
    check_host = is_loopback(bind_host) or bool(allowed)
    failures = FailedAuthLimiter()
    own: dict[Any, bool] = {}  # transport -> whether its client is this process (asked once)

    def own_connection(transport: Any) -> bool:
        if transport is None:
            return False
        if transport not in own:
            if len(own) > 1024:
                for closed in [t for t in own if t.is_closing()]:
                    del own[closed]
            own[transport] = peer_in_this_process(transport)
        return own[transport]

    @web.middleware
    async def guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get("Host")
        if check_host and host is not None and not host_allowed(host, allowed):
            return error(
                f"Host {host[:100]!r} is not this service's (a loopback name or --allowed-host)", 421
            )
        if authorized is not None:
            allowed_in = authorized(request)
        else:
            allowed_in = not token or token_matches(request.headers.get("Authorization"), token)
        if not allowed_in and not (trust_own_process and own_connection(request.transport)):
            await asyncio.sleep(failures.delay())  # guesses are slowed down, not answered at once
            return error(f"missing or wrong {credentials}", 401)
        origin = request.headers.get("Origin")
        if origin is not None and not host_allowed(origin, allowed):
            return error(f"requests from web pages are refused (Origin: {origin[:100]})", 403)
        content_type = request.headers.get("Content-Type")
        if content_type and media_type(content_type) not in types:
            return error(f"Content-Type must be {' or '.join(sorted(types))}, got {content_type!r:.100}", 415)
        return await handler(request)

    return guarded


@dataclass
class Served:
    """An application served on ``host:port`` under ``limits`` (:meth:`ConnectionLimits.serve`);
    ``await close()`` stops it. The running servers (``rlsdk serve``'s, the buffer's, ...) extend it."""

    host: str
    port: int
    runner: web.AppRunner
    limits: ConnectionLimits

    @property
    def base(self) -> str:
        """``http://host:port`` (an IPv6 host in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        """Where clients reach it (:attr:`base`, unless a server says otherwise)."""
        return self.base

    def share_token(self, token: str | None) -> None:
        """Clients made in this process (a run's generators and agents) send ``token`` to this server until it
        closes (:mod:`rlsdk.engines.run_tokens`)."""
        if token:
            run_tokens.remember(self.url, token)

    async def close(self) -> None:
        run_tokens.forget(self.url)
        await self.limits.stop(self.runner)


class ConnectionLimits:
    """Slow, idle and oversized requests cannot pile up, and idle strangers hold no slot:

    - at most ``max_connections`` open connections; when all are taken, a new one takes the slot of the
      oldest idle connection that never sent a request the guard let through (a stranger's), else of the
      connection idle longest between requests (keep-alive: HTTP lets a server close it, and without a
      token every client is let through), else it is answered 503 and closed: a connection in a request
      keeps its slot;
    - a connection that has not had a request let through within ``header_timeout`` seconds of opening
      (no request, a request sent slowly, or only refused ones) is closed;
    - a connection that is not in a request for ``idle_timeout`` seconds is closed;
    - a request body must be at most ``max_body`` bytes (413, before reading when its length is declared)
      and arrive within ``read_timeout`` seconds (408).

    Use :meth:`middleware` in the app after :func:`guard` (reaching it is being let through), then
    :meth:`listen`; :meth:`app` and :meth:`serve` do both."""

    def __init__(
        self,
        *,
        max_body: int,
        max_connections: int,
        read_timeout: float = READ_TIMEOUT,
        idle_timeout: float = IDLE_TIMEOUT,
        header_timeout: float = 10.0,
    ) -> None:
        self.max_body, self.max_connections = max_body, max_connections
        self.read_timeout, self.idle_timeout = read_timeout, idle_timeout
        self.header_timeout = min(header_timeout, idle_timeout)
        self._busy: dict[Any, int] = {}  # transport -> requests in progress
        self._last_seen: dict[Any, float] = {}  # transport -> when it last finished a request
        self._trusted: set[Any] = set()  # transports that had a request let through by the guard
        self._opened: dict[Any, float] = {}  # connection handler -> when it connected
        self._server: asyncio.base_events.Server | None = None
        self._watchdog: asyncio.Task[None] | None = None

    def middleware(self, error: ErrorReply) -> Any:
        """Tracks requests in progress; reads the body (aiohttp keeps it for the handler) under the limits.
        The app's ``client_max_size`` must be ``max_body``."""

        @web.middleware
        async def limited(request: web.Request, handler: Handler) -> web.StreamResponse:
            transport = request.transport
            self._trusted.add(transport)
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

    def app(self, checks: Sequence[Any], error: ErrorReply, after: Sequence[Any] = ()) -> web.Application:
        """An application whose requests pass ``checks`` (middlewares, :func:`guard` among them), then these
        limits (``error`` answers what they refuse), then ``after``."""
        return web.Application(
            client_max_size=self.max_body, middlewares=[*checks, self.middleware(error), *after]
        )

    async def serve(
        self,
        app: web.Application,
        host: str,
        port: int,
        *,
        handler_cancellation: bool = True,
        keepalive_timeout: float | None = None,
    ) -> tuple[web.AppRunner, int]:
        """Serve ``app`` (from :meth:`app`) on ``host:port`` (0: a free port): its runner and the port bound.
        No access log, no signal handlers; ``handler_cancellation``: a client that disconnects cancels its
        handler (which aborts its work); ``keepalive_timeout``: aiohttp's (None: its default). A runner that
        cannot listen is cleaned up."""
        options: dict[str, Any] = (
            {} if keepalive_timeout is None else {"keepalive_timeout": keepalive_timeout}
        )
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, handler_cancellation=handler_cancellation, **options
        )
        await runner.setup()
        try:
            return runner, await self.listen(runner, host, port)
        except BaseException:
            await runner.cleanup()
            raise

    async def stop(self, runner: web.AppRunner) -> None:
        """Stop what :meth:`serve` started: no new connections, then ``runner`` cleaned up."""
        self.close()
        await runner.cleanup()

    async def listen(self, runner: web.AppRunner, host: str, port: int) -> int:
        """Serve ``runner`` (set up) on ``host:port``; the port bound."""
        handlers = runner.server
        assert handlers is not None, "runner.setup() first"

        def connection() -> asyncio.Protocol:
            if len(handlers.connections) >= self.max_connections and not self._evict_an_idle_one(handlers):
                return _Refuse()
            handler = handlers()
            self._opened[handler] = time.monotonic()
            return handler

        self._server = await asyncio.get_running_loop().create_server(connection, host, port)
        self._watchdog = asyncio.create_task(self._close_idle(handlers))
        return self._server.sockets[0].getsockname()[1]

    def _stranger(self, handler: Any) -> bool:
        transport = handler.transport
        return transport is not None and transport not in self._trusted and not self._busy.get(transport)

    def _evict_an_idle_one(self, handlers: web.Server) -> bool:
        """Close the oldest connection that never had a request let through, else the one idle longest
        between requests; whether there was one (none: every connection is in a request)."""
        open_ = [h for h in handlers.connections if h.transport is not None and not h.transport.is_closing()]
        strangers = [h for h in open_ if self._stranger(h)]
        if strangers:
            min(strangers, key=lambda h: self._opened.get(h, 0.0)).transport.close()  # type: ignore[union-attr]
            return True
        idle = [h for h in open_ if not self._busy.get(h.transport)]
        if idle:
            min(idle, key=lambda h: self._last_seen.get(h.transport, 0.0)).transport.close()  # type: ignore[union-attr]
            return True
        return False

    async def _close_idle(self, handlers: web.Server) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.header_timeout / 4))
            now = time.monotonic()
            for handler in list(handlers.connections):
                transport = handler.transport
                if transport is None:
                    continue
                opened = self._opened.setdefault(handler, now)
                if self._stranger(handler) and now - opened > self.header_timeout:
                    transport.close()
                    continue
                since = self._last_seen.setdefault(transport, now)
                if not self._busy.get(transport) and now - since > self.idle_timeout:
                    transport.close()
            for transport in [t for t in self._last_seen if t.is_closing()]:
                self._last_seen.pop(transport, None)
                self._busy.pop(transport, None)
                self._trusted.discard(transport)
            live = set(handlers.connections)
            for handler in [h for h in self._opened if h not in live]:
                del self._opened[handler]

    def close(self) -> None:
        """Stop listening (then ``await runner.cleanup()`` closes the open connections); call it on the server's loop."""
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
