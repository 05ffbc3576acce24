"""Stands in for ``slime.utils.http_utils``: ``post``/``get`` with JSON, one HTTP client per event loop
(created on first use, so nothing needs ``init_http_client`` first), retried on connection errors."""

from __future__ import annotations

from argparse import Namespace
import asyncio
import socket
import weakref
from typing import Any

import httpx

from ..engines.run_tokens import auth_headers

__all__ = ["find_available_port", "get", "init_http_client", "is_port_available", "post"]

RETRY_DELAY_S = 1.0
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
    weakref.WeakKeyDictionary()
)


def _client() -> httpx.AsyncClient:
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = httpx.AsyncClient(
            timeout=httpx.Timeout(None), trust_env=False, limits=httpx.Limits(max_connections=None)
        )
    return client


def init_http_client(args: Namespace) -> None:
    """Nothing to do: clients are made on first use (kept for slime's callers)."""


async def post(url: str, payload: Any, max_retries: int = 60, headers: dict[str, str] | None = None) -> Any:
    """POST ``payload`` as JSON and return the JSON reply; connection errors and 5xx replies are retried
    up to ``max_retries`` times, a second apart; a 4xx reply raises at once."""
    for attempt in range(max_retries):
        try:
            response = await _client().post(
                url, json=payload, headers={**auth_headers(url), **(headers or {})}
            )
            if response.status_code < 500 or attempt + 1 == max_retries:
                response.raise_for_status()
                return response.json()
        except httpx.TransportError:
            if attempt + 1 == max_retries:
                raise
        await asyncio.sleep(RETRY_DELAY_S)
    raise RuntimeError(f"POST {url}: max_retries must be at least 1, got {max_retries}")


async def get(url: str) -> Any:
    """GET ``url`` and return its JSON."""
    response = await _client().get(url, headers=auth_headers(url))
    response.raise_for_status()
    return response.json()


def is_port_available(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
        return True


def find_available_port(base_port: int) -> int:
    port = base_port
    while not is_port_available(port):
        port += 1
    return port
