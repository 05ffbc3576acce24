"""The client for a real SGLang server or router (or ``rlsdk serve``): SGLang's native HTTP API."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import weakref
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from .engine import InferenceEngine
from .protocol import SERVE_TOKEN_ENV, EngineError, EngineRequestError, EngineUnavailableError

_RETRYABLE = (aiohttp.ClientConnectionError,)
"""Connection refused, reset or dropped before an answer: retried with backoff. A read timeout is not."""
_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, SGLangClient]] = (
    weakref.WeakKeyDictionary()
)


@dataclass
class Reply:
    """One HTTP answer, read whole: status and body."""

    status_code: int
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


class SGLangClient(InferenceEngine):
    """A real SGLang server or router (or ``rlsdk serve``) by URL.

    One pooled aiohttp session (httpx's pool costs too much CPU at hundreds of requests in flight:
    it halved a real server's throughput); at most ``concurrency`` requests in flight; connection errors are retried
    ``retries`` times with exponential backoff from ``backoff`` seconds. Abort, pause, flush and weight
    updates go to every worker of a router (``GET /workers``), since the router does not forward them.
    """

    def __init__(self, url: str, *, concurrency: int = 512, timeout: float = 3600.0, retries: int = 5,
                 backoff: float = 0.25) -> None:
        self.url = url.rstrip("/")
        self.concurrency = concurrency
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self._client: aiohttp.ClientSession | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None
        self._launch: list[str] | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @classmethod
    def shared(cls, url: str) -> SGLangClient:
        """One client per URL and event loop, for generators that are handed only ``args``."""
        clients = _SHARED.setdefault(asyncio.get_running_loop(), {})
        if url not in clients:
            clients[url] = cls(url)
        return clients[url]

    @classmethod
    def launching(cls, model_path: str, *, host: str = "127.0.0.1", port: int = 30000,
                  python: str | None = None, extra_args: Sequence[str] = (), **kwargs: Any) -> SGLangClient:
        """A client whose :meth:`start` runs ``python -m sglang.launch_server`` and waits for it."""
        python = python or sys.executable
        if not _has_sglang(python):
            raise EngineError(
                f"SGLang is not installed for {python}: install it there (pip install 'sglang[all]', "
                "needs a CUDA GPU) or point --sglang-url at a running server"
            )
        client = cls(f"http://{host}:{port}", **kwargs)
        client._launch = [python, "-m", "sglang.launch_server", "--model-path", model_path,
                          "--host", host, "--port", str(port), *extra_args]
        return client

    # ---------------------------------------------------------------- transport

    async def start(self, ready_timeout: float = 900.0) -> None:
        self._ensure_client()
        if self._launch and self._process is None:
            self._process = subprocess.Popen(self._launch)
            await self._wait_ready(ready_timeout)

    def _ensure_client(self) -> aiohttp.ClientSession:
        """The session of the running event loop: a client used from one ``asyncio.run`` after another
        (a generator called outside ``rlsdk run``) gets a new session instead of the closed loop's."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client_loop = loop
            connector = aiohttp.TCPConnector(limit=self.concurrency + 8, limit_per_host=0)
            timeout = aiohttp.ClientTimeout(total=self.timeout, connect=10.0)
            token = os.environ.get(SERVE_TOKEN_ENV)  # rlsdk serve's token (SGLang's --api-key is one too)
            headers = {"Authorization": f"Bearer {token}"} if token else None
            self._client = aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers)
            self._slots = asyncio.Semaphore(self.concurrency)
        return self._client

    async def _wait_ready(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise EngineError(f"sglang.launch_server exited with {self._process.returncode}: {self._launch}")
            try:
                async with self._ensure_client().get(f"{self.url}/health",
                                                     timeout=aiohttp.ClientTimeout(total=5)) as response:
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(1.0)
        raise EngineUnavailableError(f"SGLang at {self.url} not ready after {timeout:.0f}s")

    async def _request(self, method: str, path: str, *, base: str | None = None, body: Any = None,
                       ok_statuses: tuple[int, ...] = ()) -> Reply:
        """One HTTP call with retries on connection errors; 4xx/5xx raise (unless in ``ok_statuses``)."""
        client = self._ensure_client()
        url = f"{base or self.url}{path}"
        for attempt in range(self.retries + 1):
            try:
                async with client.request(method, url, json=body) as answer:
                    response = Reply(answer.status, await answer.text())
                break
            except _RETRYABLE as exc:
                if attempt == self.retries:
                    raise EngineUnavailableError(
                        f"cannot reach SGLang at {url} after {self.retries + 1} tries: {exc!r}"
                    ) from exc
                await asyncio.sleep(min(self.backoff * 2**attempt, 10.0))
        if response.status_code >= 400 and response.status_code not in ok_statuses:
            _raise_for(response, url)
        return response

    # ---------------------------------------------------------------- generation

    async def generate(self, payload: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        self._ensure_client()
        assert self._slots is not None
        async with self._slots:
            return (await self._request("POST", "/generate", body=payload)).json()

    async def generate_stream(self, payload: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        client = self._ensure_client()
        assert self._slots is not None
        async with self._slots:
            try:
                async with client.post(f"{self.url}/generate", json={**payload, "stream": True}) as r:
                    if r.status >= 400:
                        _raise_for(Reply(r.status, await r.text()), f"{self.url}/generate")
                    async for raw in r.content:
                        line = raw.decode().strip()
                        if not line.startswith("data:"):
                            continue
                        data = line[len("data:"):].strip()
                        if data == "[DONE]":
                            return
                        yield json.loads(data)
            except _RETRYABLE as exc:
                raise EngineUnavailableError(f"stream from {self.url} failed: {exc!r}") from exc

    # ---------------------------------------------------------------- control

    async def workers(self) -> list[str]:
        """The worker URLs behind a router (``GET /workers``), or this server's URL."""
        response = await self._request("GET", "/workers", ok_statuses=(404, 405))
        if response.status_code == 200:
            try:
                urls = [w["url"].rstrip("/") for w in response.json().get("workers", [])]
            except (ValueError, AttributeError, KeyError, TypeError):
                urls = []
            if urls:
                return urls
        return [self.url]  # type: ignore[list-item]

    async def abort(self, rid: str | None = None) -> None:
        body = {"abort_all": True} if rid is None else {"rid": rid}
        for worker in await self.workers():
            await self._request("POST", "/abort_request", base=worker, body=body)

    async def load(self) -> dict[str, int]:
        total = {"num_running_reqs": 0, "num_waiting_reqs": 0}
        for worker in await self.workers():
            for entry in (await self._request("GET", "/v1/loads?include=core", base=worker)).json()["loads"]:
                for key in total:
                    total[key] += int(entry.get(key, 0))
        return total

    async def model_info(self) -> dict[str, Any]:
        response = await self._request("GET", "/model_info", ok_statuses=(404,))
        if response.status_code == 404:  # SGLang before /model_info
            response = await self._request("GET", "/get_model_info")
        return response.json()

    async def weight_version(self) -> str:
        """The served weights' version, read from ``/model_info`` (``/get_weight_version`` is gone in 0.5.17)."""
        return str((await self.model_info()).get("weight_version", "default"))

    async def pause(self, mode: str = "abort") -> None:
        for worker in await self.workers():
            await self._request("POST", "/pause_generation", base=worker, body={"mode": mode})

    async def resume(self) -> None:
        for worker in await self.workers():
            await self._request("POST", "/continue_generation", base=worker, body={})

    async def flush_cache(self) -> bool:
        flushed = True
        for worker in await self.workers():
            response = await self._request("GET", "/flush_cache", base=worker, ok_statuses=(400,))
            flushed &= response.status_code == 200
        return flushed

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None,
                                       flush_timeout: float = 60.0) -> None:
        """The weight-update sequence on every worker: pause, flush the cache, update, continue."""
        await self.pause()
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + flush_timeout
            while not await self.flush_cache():
                if loop.time() > deadline:
                    raise EngineError(f"{self.url}: cache not flushed after {flush_timeout:.0f}s (requests still running)")
                await asyncio.sleep(0.1)
            body: dict[str, Any] = {"model_path": model_path}
            if weight_version is not None:
                body["weight_version"] = weight_version
            for worker in await self.workers():
                result = (await self._request("POST", "/update_weights_from_disk", base=worker, body=body)).json()
                if not result.get("success", False):
                    raise EngineError(f"{worker}: weight update from {model_path} failed: {result.get('message')}")
        finally:
            await self.resume()

    async def close(self) -> None:
        if self._client is not None and self._client_loop is asyncio.get_running_loop():
            await self._client.close()  # a session of a loop that has ended went with it
        self._client = None
        if self._process is not None:
            self._process.terminate()
            try:
                await asyncio.to_thread(self._process.wait, 30)
            except subprocess.TimeoutExpired:
                self._process.kill()
            self._process = None


def _raise_for(response: Reply, url: str) -> None:
    try:
        message = response.json().get("message") or response.text
    except (ValueError, AttributeError):
        message = response.text
    if 400 <= response.status_code < 500:
        raise EngineRequestError(f"{url} answered {response.status_code}: {message}")
    raise EngineError(f"{url} answered {response.status_code}: {message}")


def _has_sglang(python: str) -> bool:
    if python == sys.executable:
        return importlib.util.find_spec("sglang") is not None
    check = "import importlib.util, sys; sys.exit(importlib.util.find_spec('sglang') is None)"
    try:
        return subprocess.run([python, "-c", check], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
