"""The HTTP side of an engine client (SGLang's, vLLM's, an engine plugin's): one pooled aiohttp session per
event loop, at most ``concurrency`` requests in flight, connection errors and HTTP 5xx retried with backoff,
error answers raised as :class:`EngineError` kinds, streamed answers read as JSON events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any
from urllib.parse import urlencode

import aiohttp

from ..aio.backoff import backoff_delay
from .protocol import EngineError, EngineRequestError, EngineUnavailableError, unreadable

RETRYABLE = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)
"""Connection refused, reset or dropped before a whole answer: retried with backoff, as an HTTP 5xx is.
A read timeout is not."""
MAX_BACKOFF = 10.0
"""Seconds one wait between retries lasts at most."""


@dataclass
class EngineReply:
    """One HTTP answer, read whole: status, body and the URL that gave it."""

    status_code: int
    text: str
    url: str = ""

    def json(self, expected: str = "a JSON body") -> Any:
        """The body as JSON; :class:`EngineResponseError` naming the URL when it is not JSON."""
        try:
            return json.loads(self.text)
        except ValueError:
            raise unreadable(
                self.url, f"answered {self.status_code} with a body that is not JSON", expected, self.text
            ) from None


def message_field(body: Any) -> Any:
    """SGLang's error answers: ``{"message": ...}``."""
    return body.get("message")


@dataclass(eq=False)
class EngineHTTP:
    """An engine server's HTTP API at ``base`` (or through the Unix socket ``socket``, ``base`` then naming
    the host), for an engine client to build on.

    ``engine`` and ``where`` name the engine and the server in messages (``where`` defaults to ``base``);
    ``token``, called when a session opens, gives the bearer token to send (None: none); ``error_message``
    finds the message in an error answer's JSON body (default: its ``message``; else the whole text). At
    most ``concurrency`` requests hold :attr:`slots`; connection errors and HTTP 5xx answers are retried
    ``retries`` times with exponential backoff (full jitter) from ``backoff`` seconds."""

    base: str
    _: KW_ONLY
    engine: str
    where: str | None = None
    socket: str | None = None
    token: Callable[[], str | None] | None = None
    error_message: Callable[[Any], Any] = message_field
    concurrency: int = 512
    timeout: float = 3600.0
    retries: int = 5
    backoff: float = 0.25
    _client: aiohttp.ClientSession | None = field(default=None, init=False, repr=False)
    _client_loop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False)
    _slots: asyncio.Semaphore | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.base = self.base.rstrip("/")
        self.where = (self.where or self.base).rstrip("/")

    def session(self) -> aiohttp.ClientSession:
        """The session of the running event loop: a client used from one ``asyncio.run`` after another
        (a generator called outside ``rlsdk run``) gets a new session instead of the closed loop's."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client_loop = loop
            connector: aiohttp.BaseConnector = (
                aiohttp.UnixConnector(path=self.socket, limit=self.concurrency + 8)
                if self.socket
                else aiohttp.TCPConnector(limit=self.concurrency + 8, limit_per_host=0)
            )
            timeout = aiohttp.ClientTimeout(total=self.timeout, connect=10.0)
            token = self.token() if self.token else None
            headers = {"Authorization": f"Bearer {token}"} if token else None
            self._client = aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers)
            self._slots = asyncio.Semaphore(self.concurrency)
        return self._client

    @property
    def slots(self) -> asyncio.Semaphore:
        """The running loop's cap on requests in flight (``concurrency``), for generation to hold."""
        self.session()
        assert self._slots is not None
        return self._slots

    async def request(
        self,
        method: str,
        path: str,
        *,
        base: str | None = None,
        body: Any = None,
        query: Mapping[str, Any] | list[tuple[str, Any]] | None = None,
        ok: tuple[int, ...] = (),
        retry: bool = True,
    ) -> EngineReply:
        """One HTTP call to ``path`` (of ``base``: another server, such as a router's worker), retried on
        connection errors and 5xx (with ``retry``); a 4xx or the last 5xx raises unless its status is in
        ``ok``."""
        session = self.session()
        suffix = path + (f"?{urlencode(query)}" if query else "")
        url, shown = (f"{base}{suffix}",) * 2 if base else (f"{self.base}{suffix}", f"{self.where}{suffix}")
        tries = self.retries + 1 if retry else 1
        for attempt in range(tries):
            if attempt:
                await asyncio.sleep(backoff_delay(attempt - 1, self.backoff, MAX_BACKOFF))
            try:
                async with session.request(method, url, json=body) as answer:
                    reply = EngineReply(answer.status, await answer.text(), shown)
            except RETRYABLE as exc:
                if attempt == tries - 1:
                    raise EngineUnavailableError(
                        f"cannot reach {self.engine} at {shown} after {attempt + 1} "
                        f"{'try' if attempt == 0 else 'tries'}: {type(exc).__name__}: {exc}"
                    ) from exc
                continue
            if reply.status_code < 500 or reply.status_code in ok:
                break
        if reply.status_code >= 400 and reply.status_code not in ok:
            raise self.error(reply, tries=attempt + 1)
        return reply

    def error(self, reply: EngineReply, tries: int = 1) -> EngineError:
        """The error for an answer with an error status: :class:`EngineRequestError` for a 4xx."""
        try:
            message = self.error_message(json.loads(reply.text)) or reply.text
        except (ValueError, AttributeError):
            message = reply.text
        message = str(message)[:500]
        if 400 <= reply.status_code < 500:
            return EngineRequestError(f"{reply.url} answered {reply.status_code}: {message}")
        after = f" after {tries} tries" if tries > 1 else ""
        return EngineError(f"{reply.url} answered {reply.status_code}{after}: {message}")

    async def events(self, path: str, body: Any, expected: str) -> AsyncIterator[Any]:
        """``body`` POSTed to ``path`` for a streamed answer (server-sent events: ``data: {...}`` lines, then
        ``data: [DONE]``), each event's JSON (``expected`` names what it should be, for the error when it is
        not JSON). Holds one of :attr:`slots` while it streams."""
        source = f"{self.where}{path} (stream)"
        async with self.slots:
            try:
                async with self.session().post(f"{self.base}{path}", json=body) as answer:
                    if answer.status >= 400:
                        raise self.error(
                            EngineReply(answer.status, await answer.text(), f"{self.where}{path}")
                        )
                    async for raw in answer.content:
                        line = raw.decode(errors="replace").strip()
                        if not line.startswith("data:"):
                            continue
                        data = line[len("data:") :].strip()
                        if data == "[DONE]":
                            return
                        try:
                            event = json.loads(data)
                        except ValueError:
                            raise unreadable(source, "a chunk that is not JSON", expected, data) from None
                        yield event
            except RETRYABLE as exc:
                raise EngineUnavailableError(f"stream from {self.where} failed: {exc!r}") from exc

    async def health(self, timeout: float) -> str | None:
        """None when ``/health`` answers 200 within ``timeout`` seconds; else what it did."""
        try:
            async with self.session().get(
                f"{self.base}/health", timeout=aiohttp.ClientTimeout(total=timeout)
            ) as answer:
                return None if answer.status == 200 else f"{self.where}/health answered {answer.status}"
        except (TimeoutError, aiohttp.ClientError) as exc:
            return f"{self.where}/health failed: {exc!r}"

    async def close(self) -> None:
        """The session closed (a session of a loop that has ended went with it)."""
        if self._client is not None and self._client_loop is asyncio.get_running_loop():
            await self._client.close()
        self._client = None
