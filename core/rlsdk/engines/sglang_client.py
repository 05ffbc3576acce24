"""The client for a real SGLang server or router (or ``rlsdk serve``): SGLang's native HTTP API."""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from . import run_tokens
from .engine import InferenceEngine
from .engine_http import EngineHTTP
from .launch.process_group import free_port
from .weight_checksums import SGLANG_FUSED, ServedChecksums, sglang_checksums
from .protocol import (
    GENERATE_RESPONSE,
    SERVE_TOKEN_ENV,
    EngineError,
    check_generate_response,
    new_rid,
    unreadable,
)

if TYPE_CHECKING:
    from .launch.sglang import SGLangLauncher
    from .tensor_transport import FlatWeights

log = logging.getLogger(__name__)
_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, SGLangClient]] = (
    weakref.WeakKeyDictionary()
)


class SGLangClient(InferenceEngine):
    """A real SGLang server or router (or ``rlsdk serve``) by URL.

    One pooled aiohttp session (httpx's pool costs too much CPU at hundreds of requests in flight:
    it halved a real server's throughput); at most ``concurrency`` requests in flight; connection errors and
    HTTP 5xx answers are retried ``retries`` times with exponential backoff (full jitter) from ``backoff``
    seconds; answers that are not SGLang's shapes raise :class:`EngineResponseError`. Abort, pause, flush
    and weight updates go to every worker of a router (``GET /workers``), since the router does not forward them.
    """

    def __init__(
        self,
        url: str,
        *,
        concurrency: int = 512,
        timeout: float = 3600.0,
        retries: int = 5,
        backoff: float = 0.25,
        launcher: SGLangLauncher | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.http = EngineHTTP(
            self.url,
            engine="SGLang",
            # the token of a server this process started for itself, else rlsdk serve's (SGLang's --api-key)
            token=lambda: run_tokens.token_for(self.url or "") or os.environ.get(SERVE_TOKEN_ENV),
            concurrency=concurrency,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
        )
        self.launcher = launcher
        """The servers (and router) this client started (:mod:`rlsdk.engines.launch.sglang`) and stops on
        close."""
        self._launched = False
        self.lora_name: str | None = None
        """The LoRA adapter every ``/generate`` names in ``lora_path`` (the one loaded last), or None."""
        self._said_no_checksums = False
        self._broadcast: tuple[str, Any, list[str]] | None = None
        """The weight broadcast group joined (:meth:`join_weight_broadcast`): its name, this process's side, the
        workers in it."""

    @classmethod
    def shared(cls, url: str) -> SGLangClient:
        """One client per URL and event loop, for generators that are handed only ``args``."""
        clients = _SHARED.setdefault(asyncio.get_running_loop(), {})
        if url not in clients:
            clients[url] = cls(url)
        return clients[url]

    # ---------------------------------------------------------------- transport

    async def start(self) -> None:
        if self.launcher is not None and not self._launched:
            await self.launcher.start()
            self._launched = True
        self.http.session()

    # ---------------------------------------------------------------- generation

    def _with_adapter(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``payload`` naming the loaded LoRA adapter in ``lora_path`` (unless it names one itself)."""
        if self.lora_name is None or not isinstance(payload, dict) or "lora_path" in payload:
            return payload
        return {**payload, "lora_path": self.lora_name}

    async def generate(self, payload: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        async with self.http.slots:
            reply = await self.http.request("POST", "/generate", body=self._with_adapter(payload))
        return check_generate_response(reply.json(GENERATE_RESPONSE), reply.url)

    async def generate_stream(self, payload: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        body = {**self._with_adapter(payload), "stream": True}
        async for chunk in self.http.events("/generate", body, GENERATE_RESPONSE):
            yield check_generate_response(chunk, f"{self.url}/generate (stream)")

    # ---------------------------------------------------------------- control

    async def workers(self) -> list[str]:
        """The worker URLs behind a router (``GET /workers``), or this server's URL."""
        response = await self.http.request("GET", "/workers", ok=(404, 405))
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
            await self.http.request("POST", "/abort_request", base=worker, body=body)

    async def load(self) -> dict[str, int]:
        total = {"num_running_reqs": 0, "num_waiting_reqs": 0}
        for worker in await self.workers():
            for entry in (await self.http.request("GET", "/v1/loads?include=core", base=worker)).json()[
                "loads"
            ]:
                for key in total:
                    total[key] += int(entry.get(key, 0))
        return total

    async def model_info(self) -> dict[str, Any]:
        response = await self.http.request("GET", "/model_info", ok=(404,))
        if response.status_code == 404:  # SGLang before /model_info
            response = await self.http.request("GET", "/get_model_info")
        return response.json()

    async def weight_version(self) -> str:
        """The served weights' version, read from ``/model_info`` (``/get_weight_version`` is gone in 0.5.17)."""
        return str((await self.model_info()).get("weight_version", "default"))

    async def pause(self, mode: str = "abort") -> None:
        for worker in await self.workers():
            await self.http.request("POST", "/pause_generation", base=worker, body={"mode": mode})

    async def resume(self) -> None:
        for worker in await self.workers():
            await self.http.request("POST", "/continue_generation", base=worker, body={})

    async def flush_cache(self) -> bool:
        flushed = True
        for worker in await self.workers():
            response = await self.http.request("GET", "/flush_cache", base=worker, ok=(400,))
            flushed &= response.status_code == 200
        return flushed

    async def update_weights_from_disk(
        self, model_path: str, weight_version: str | None = None, flush_timeout: float = 60.0
    ) -> None:
        """The weight-update sequence on every worker: pause, flush the cache, update, continue."""
        await self.pause()
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + flush_timeout
            while not await self.flush_cache():
                if loop.time() > deadline:
                    raise EngineError(
                        f"{self.url}: cache not flushed after {flush_timeout:.0f}s (requests still running)"
                    )
                await asyncio.sleep(0.1)
            body: dict[str, Any] = {"model_path": model_path}
            if weight_version is not None:
                body["weight_version"] = weight_version
            for worker in await self.workers():
                result = (
                    await self.http.request("POST", "/update_weights_from_disk", base=worker, body=body)
                ).json()
                if not result.get("success", False):
                    raise EngineError(
                        f"{worker}: weight update from {model_path} failed: {result.get('message')}"
                    )
        finally:
            await self.resume()

    # ---------------------------------------------------------------- LoRA adapters

    async def load_lora_adapter(self, lora_name: str, lora_path: str) -> None:
        """``/load_lora_adapter`` on every worker (the server runs with ``--enable-lora``); from then on every
        ``/generate`` of this client names the adapter in ``lora_path``."""
        await self._lora_call("/load_lora_adapter", {"lora_name": lora_name, "lora_path": lora_path})
        self.lora_name = lora_name

    async def unload_lora_adapter(self, lora_name: str) -> None:
        await self._lora_call("/unload_lora_adapter", {"lora_name": lora_name})
        if self.lora_name == lora_name:
            self.lora_name = None

    async def _lora_call(self, path: str, body: dict[str, Any]) -> None:
        for worker in await self.workers():
            result = (await self.http.request("POST", path, base=worker, body=body, ok=(400, 403))).json()
            if not isinstance(result, dict) or not result.get("success", False):
                why = result.get("error_message") if isinstance(result, dict) else result
                raise EngineError(f"{worker}{path} {body['lora_name']!r} failed: {why}")

    async def update_weight_version(self, version: str) -> None:
        """``/update_weight_version`` on every worker: what ``/model_info`` and each response report."""
        for worker in await self.workers():
            body = {"new_version": version, "abort_all_requests": False}
            result = (
                await self.http.request("POST", "/update_weight_version", base=worker, body=body, ok=(400,))
            ).json()
            if not isinstance(result, dict) or not result.get("success", False):
                raise EngineError(f"{worker}/update_weight_version failed: {result}")

    # ---------------------------------------------------------------- GPU weight sync

    weight_transports = frozenset({"tensor", "nccl"})

    async def server_info(self, worker: str) -> dict[str, Any]:
        """A worker's ``/server_info`` (``/get_server_info`` before SGLang 0.5): its server arguments and state."""
        response = await self.http.request("GET", "/server_info", base=worker, ok=(404,))
        if response.status_code == 404:
            response = await self.http.request("GET", "/get_server_info", base=worker)
        info = response.json("the server's arguments (an object)")
        if not isinstance(info, dict):
            raise EngineError(f"{worker}/server_info answered {str(info)[:200]!r}, not an object")
        return info

    async def tp_size(self, worker: str) -> int:
        """A worker's tensor-parallel size (``/server_info``), one CUDA-IPC payload per rank."""
        return int((await self.server_info(worker)).get("tp_size", 1))

    async def nondeterminism(self) -> str | None:
        """None when every worker reports SGLang's deterministic inference on (``--enable-deterministic-inference``
        in its ``/server_info``: batch-invariant kernels, so a seeded request's output depends on its body
        alone); else which worker does not, and why."""
        for worker in await self.workers():
            try:
                info = await self.server_info(worker)
            except EngineError as exc:
                return f"the SGLang server at {worker} does not report its arguments ({exc})"
            if info.get("enable_deterministic_inference") is not True:
                return (
                    f"the SGLang server at {worker} runs without --enable-deterministic-inference (its "
                    f"/server_info says {info.get('enable_deterministic_inference')!r}): its batches, formed as "
                    "requests arrive, change a request's log-probs and tokens; start it with that flag"
                )
        return None

    async def release_memory(self, tags: list[str] | None = None) -> None:
        """``/release_memory_occupation`` on every worker (all of weights, KV cache and CUDA graphs by
        default); the server needs ``--enable-memory-saver`` (``--colocate`` launches it so)."""
        for worker in await self.workers():
            await self.http.request("POST", "/release_memory_occupation", base=worker, body={"tags": tags})

    async def resume_memory(self, tags: list[str] | None = None) -> None:
        for worker in await self.workers():
            await self.http.request("POST", "/resume_memory_occupation", base=worker, body={"tags": tags})

    async def post_weights(self, worker: str, path: str, body: dict[str, Any]) -> None:
        """One weight-update call (``/update_weights_from_tensor``, ``/init_weights_update_group``,
        ``/update_weights_from_distributed``) that must answer ``success``."""
        result = (await self.http.request("POST", path, base=worker, body=body, ok=(400, 403))).json()
        if not result.get("success", False):
            raise EngineError(f"{worker}{path} failed: {result.get('message')}")

    async def update_weights_from_tensor(
        self, buckets: AsyncIterator[tuple[FlatWeights, bool]], weight_version: str, flush_cache: bool = True
    ) -> None:
        """``/update_weights_from_tensor`` (``flattened_bucket``) on every worker, each bucket as one CUDA-IPC
        handle per tensor-parallel rank; the version and the cache flush come with the last bucket, so an
        engine that stops half way still reports the weights it had."""
        from .tensor_transport import LOAD_FORMAT, serialize_for_sglang

        workers = [(w, await self.tp_size(w)) for w in await self.workers()]
        async for flat, last in buckets:
            payload = await asyncio.to_thread(serialize_for_sglang, flat)
            for worker, ranks in workers:
                await self.post_weights(
                    worker,
                    "/update_weights_from_tensor",
                    {
                        "serialized_named_tensors": [payload] * ranks,
                        "load_format": LOAD_FORMAT,
                        "flush_cache": last and flush_cache,
                        "weight_version": weight_version if last else None,
                    },
                )
            del flat, payload

    async def join_weight_broadcast(self, master_address: str, backend: str = "nccl") -> None:
        """``/init_weights_update_group`` on every worker (its ranks after the trainer's 0) while this process
        joins as rank 0 (:func:`~rlsdk.engines.tensor_transport.init_broadcast_group`)."""
        if self._broadcast is not None:
            return
        from .tensor_transport import init_broadcast_group

        workers = await self.workers()
        ranks = [await self.tp_size(worker) for worker in workers]
        port = free_port(master_address)
        world = 1 + sum(ranks)
        offsets = [1 + sum(ranks[:i]) for i in range(len(ranks))]
        group_name = f"rlsdk_weights_{new_rid()[:12]}"  # a process may join several groups: one name each
        joins = [
            self.post_weights(
                worker,
                "/init_weights_update_group",
                {
                    "master_address": master_address,
                    "master_port": port,
                    "rank_offset": offset,
                    "world_size": world,
                    "group_name": group_name,
                    "backend": backend,
                },
            )
            for worker, offset in zip(workers, offsets, strict=True)
        ]
        group, *_ = await asyncio.gather(
            asyncio.to_thread(init_broadcast_group, master_address, port, world, group_name, backend), *joins
        )
        self._broadcast = (group_name, group, workers)

    async def update_weights_from_distributed(
        self, buckets: AsyncIterator[tuple[FlatWeights, bool]], weight_version: str
    ) -> None:
        """Each bucket broadcast from this process while every worker receives it
        (``/update_weights_from_distributed``); the version and the cache flush come with the last."""
        from .tensor_transport import broadcast

        if self._broadcast is None:
            raise EngineError(f"{self.url}: join_weight_broadcast before update_weights_from_distributed")
        group_name, group, workers = self._broadcast
        async for flat, last in buckets:
            body = flat.distributed_body(group_name, weight_version if last else None, flush_cache=last)
            announce = [self.post_weights(w, "/update_weights_from_distributed", body) for w in workers]
            await asyncio.gather(asyncio.to_thread(broadcast, flat, group), *announce)
            del flat

    async def weight_checksums(self) -> list[ServedChecksums] | None:
        """``/weights_checker`` (``checksum``) of every worker; None where a worker has no such route
        (SGLang before 0.5.17) or cannot compute it (quantized weights it cannot read back: SGLang answers
        400), said once in the log."""
        served: list[ServedChecksums] = []
        for worker in await self.workers():
            reply = await self.http.request(
                "POST", "/weights_checker", base=worker, body={"action": "checksum"}, ok=(400, 404)
            )
            if reply.status_code != 200:
                if not self._said_no_checksums:
                    log.warning(
                        "%s/weights_checker answered %s (%s): the trust check compares log-probs only",
                        worker,
                        reply.status_code,
                        reply.text[:200],
                    )
                    self._said_no_checksums = True
                return None
            try:
                served += sglang_checksums(reply.json(), worker, SGLANG_FUSED)
            except ValueError as exc:
                raise unreadable(
                    f"{worker}/weights_checker", str(exc), "SGLang's checksum answer", reply.text
                ) from None
        return served

    async def health_problem(self, timeout: float) -> str | None:
        """None while the engine is healthy (the servers it launched run, and it answers ``/health`` within
        ``timeout`` seconds); else what is wrong. Launched servers of which one exited are stopped, each
        process group whole, so that none is left holding a GPU."""
        if self.launcher is not None and self._launched and (exited := self.launcher.exited()):
            await asyncio.to_thread(self.launcher.stop)
            self._launched = False
            return exited
        return await self.http.health(timeout)

    async def close(self) -> None:
        await self.http.close()
        if self.launcher is not None and self._launched:
            await asyncio.to_thread(self.launcher.stop)
            self._launched = False
