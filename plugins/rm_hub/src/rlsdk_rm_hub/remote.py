"""The ``remote`` reward: POST ``{"prompt", "response", "label"}`` to ``args.rm_url`` (slime's format) and
return the JSON number or dict. Connection errors, timeouts and 5xx are retried with exponential backoff
and jitter; a 4xx or a malformed reply fails the sample at once."""

from __future__ import annotations

import asyncio
import numbers
import weakref
from typing import Any

from rlsdk import backoff_delay

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, int], Any]] = (
    weakref.WeakKeyDictionary()
)


class RemoteRewardError(RuntimeError):
    """The reward server answered with an error or a reply that is not a reward."""


def _client(max_connections: int) -> Any:
    """One client per event loop (httpx clients are bound to a loop), reusing connections."""
    import httpx

    per_loop = _clients.setdefault(asyncio.get_running_loop(), {})
    key = ("client", max_connections)
    if key not in per_loop:
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        per_loop[key] = httpx.AsyncClient(limits=limits)
    return per_loop[key]


async def post_reward(
    url: str, payload: dict[str, Any], *, timeout: float, retries: int, backoff: float, max_connections: int
) -> float | dict[str, Any]:
    """POST ``payload`` and return the reward, retrying transient failures ``retries`` times."""
    import httpx

    client = _client(max_connections)
    for attempt in range(retries + 1):
        try:
            response = await client.post(url, json=payload, timeout=timeout)
        except (httpx.TransportError, httpx.TimeoutException) as exc:
            failure = f"{type(exc).__name__}: {exc}"
        else:
            if response.status_code < 400:
                return _reward_from(response)
            failure = f"HTTP {response.status_code}: {response.text[:200]}"
            if response.status_code < 500:
                raise RemoteRewardError(f"{url} answered {failure}")
        if attempt < retries:
            await asyncio.sleep(backoff_delay(attempt, backoff))
    raise RemoteRewardError(f"{url} failed after {retries + 1} attempts; last: {failure}")


def _reward_from(response: Any) -> float | dict[str, Any]:
    try:
        value = response.json()
    except ValueError:
        raise RemoteRewardError(
            f"{response.request.url} answered malformed JSON: {response.text[:200]!r}"
        ) from None
    if isinstance(value, dict):
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise RemoteRewardError(f"{response.request.url} answered {value!r}: expected a number or an object")


async def remote(args: Any, sample: Any, **kwargs: Any) -> float | dict[str, Any]:
    """Ask a reward server at ``args.rm_url``: POST {prompt, response, label}, get a number or a dict."""
    url = getattr(args, "rm_url", None)
    if not url:
        raise RemoteRewardError("the remote reward needs a URL: set rm_url (--rm-url)")
    payload = {"prompt": sample.prompt, "response": sample.response, "label": sample.label}
    return await post_reward(
        url,
        payload,
        timeout=float(getattr(args, "rm_request_timeout", 30.0)),
        retries=int(getattr(args, "rm_retries", 3)),
        backoff=float(getattr(args, "rm_backoff", 0.5)),
        max_connections=int(getattr(args, "rm_max_connections", 64)),
    )
