"""The rules both HTTP services (``rlsdk serve`` and ``rlsdk buffer serve``) apply before any work.

- Loopback by default; bound anywhere else a bearer token is required (:func:`check_binding`).
- With a token, every request must carry ``Authorization: Bearer <token>``, compared in constant time.
- Requests from web pages are refused: a page can make a browser send a cross-site POST (a form post as
  ``text/plain``, ``application/x-www-form-urlencoded`` or ``multipart/form-data``, or a body-less
  ``fetch``) without asking the server first, but not a JSON one, and the browser always names the page in
  ``Origin``. So a request whose ``Origin`` is not the service itself gets 403, and a ``Content-Type``
  other than JSON gets 415 (programs that send none, as some slime-style clients do, are served).
"""

from __future__ import annotations

import hmac
import ipaddress
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
