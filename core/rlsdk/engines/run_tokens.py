"""Bearer tokens of the HTTP servers started in this process, for the clients this process makes.

A server a run starts for itself (the loopback engine server slime-style generators POST to, the chat
endpoint of ``openai_agent``) is reachable by every local process, so it gets a secret of its own
(:func:`new_token`, or ``$RLSDK_SERVE_TOKEN`` when the operator set one to share with agents outside the
run). The server records it here (:func:`remember`) and the run's own clients (the SGLang client, the
``slime.utils.http_utils`` stand-in, the OpenAI clients of agents) look it up by URL
(:func:`auth_headers`), so the token is sent only to the server it belongs to.
"""

from __future__ import annotations

import secrets
from urllib.parse import urlsplit

_TOKENS: dict[str, str] = {}
"""``host:port`` of a server started here -> its token."""


def new_token() -> str:
    """A fresh secret (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def _key(url: str) -> str:
    try:
        return urlsplit(url if "://" in url else "//" + url).netloc.lower()
    except ValueError:
        return ""


def remember(url: str, token: str) -> None:
    """Record the token of the server at ``url``."""
    _TOKENS[_key(url)] = token


def forget(url: str) -> None:
    """The server at ``url`` stopped."""
    _TOKENS.pop(_key(url), None)


def token_for(url: str) -> str | None:
    """The token of the server started here that ``url`` points at, if any."""
    return _TOKENS.get(_key(url)) if _TOKENS else None


def auth_headers(url: str) -> dict[str, str]:
    """``Authorization`` for a request to ``url`` when it is a server started here with a token; else empty."""
    token = token_for(url)
    return {"Authorization": f"Bearer {token}"} if token else {}
