"""rlsdk's engine protocol spoken to a vLLM 0.26 server: its OpenAI completions API and its RL routes.

The routes (read from vLLM 0.26.0's ``vllm/entrypoints``; those marked *dev* exist only with
``VLLM_SERVER_DEV_MODE=1``):

- generation: ``POST /v1/completions`` (:mod:`.translate`); abort: ``POST /abort_requests`` (*dev*,
  ``{"request_ids": [...]}``, none: all), which ends each request with ``finish_reason: "abort"`` and what
  it generated so far;
- ``POST /pause?mode=abort|keep|wait`` and ``POST /resume`` (*dev*): rlsdk's ``abort`` and ``in_place``
  pauses are vLLM's ``abort`` and ``keep``; SGLang's ``retract`` has no vLLM counterpart and is refused;
- load: ``GET /metrics`` (``vllm:num_requests_running``, ``vllm:num_requests_waiting``); the prefix cache:
  ``POST /reset_prefix_cache`` (*dev*, ``{"success": bool}``);
- weights from disk: ``POST /collective_rpc`` (*dev*) calling every worker's ``reload_weights`` with
  ``weights_path``, inside ``/pause?mode=abort`` and ``/resume``;
- weights from the trainer: ``/init_weight_transfer_engine`` (NCCL), ``/start_weight_update``, one
  ``/update_weights`` per bucket, ``/finish_weight_update`` (*dev*; the server is started with
  ``--weight-transfer-config '{"backend": "ipc"}'`` or ``"nccl"``). Between start and finish vLLM keeps the
  model's layers on the meta device, so no step may run: the update happens paused (``keep``), or asleep;
- memory: ``POST /sleep?level=2&mode=abort`` drops weights and KV cache (``--enable-sleep-mode``);
  ``POST /wake_up?tags=weights`` and ``?tags=kv_cache`` take them back, and vLLM schedules again once both are;
- LoRA: ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` (with
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``); a request names its adapter as its ``model``;
- ``GET /v1/models`` (model path), ``GET /get_world_size`` (*dev*), ``GET /health``.

vLLM keeps no weight version: this client keeps it (set by each update) and reports it in ``/model_info``
and every answer. ``weight_checksums`` calls the worker extension rlsdk starts vLLM with
(:mod:`rlsdk_vllm_worker`) through ``/collective_rpc``; a server without it has none (the trust check's
log-prob checks decide alone).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from rlsdk.engine_api import (
    EngineHTTP,
    EngineError,
    EngineRequestError,
    EngineResponseError,
    InferenceEngine,
    ServedChecksums,
    new_rid,
    split_batch,
)
from rlsdk.trainer_api import free_port

from .translate import Accumulated, completion_request, sglang_response, vllm_request_id

if TYPE_CHECKING:
    from .launch import VLLMLauncher

log = logging.getLogger(__name__)

API_KEY_ENV = "VLLM_API_KEY"
"""The bearer token vLLM's ``--api-key`` (or this variable in its environment) requires on ``/v1`` routes;
the client sends it when set."""
PAUSE_MODES = {"abort": "abort", "in_place": "keep"}
"""rlsdk's (SGLang's) pause modes -> vLLM's."""
RESUMED_BY = {"weights": "weights", "kv_cache": "kv_cache", "cuda_graph": "kv_cache"}
"""SGLang's memory tags -> the vLLM sleep tag that brings each back (vLLM keeps CUDA graphs with the cache)."""
EXIT_WAIT = 2.0
"""Seconds a launched server whose ``/health`` failed is given to show its exit (named in place of the failure)."""


class VLLMClient(InferenceEngine):
    """A vLLM 0.26 server by URL, or on a Unix socket (``socket``: how rlsdk launches it), behind rlsdk's
    engine protocol.

    ``url`` stays None: the server does not speak SGLang's ``/generate``, so a run serves this client on
    loopback for generators that POST there (:attr:`server` names the vLLM server itself). At most
    ``concurrency`` requests in flight; connection errors and HTTP 5xx answers are retried ``retries`` times
    with backoff from ``backoff`` seconds, except weight updates, which are not repeatable."""

    weight_transports = frozenset({"tensor", "nccl"})

    def __init__(
        self,
        url: str | None = None,
        *,
        socket: str | None = None,
        launcher: VLLMLauncher | None = None,
        concurrency: int = 512,
        timeout: float = 3600.0,
        retries: int = 5,
        backoff: float = 0.25,
    ) -> None:
        if (url is None) == (socket is None):
            raise ValueError("VLLMClient takes a url or a socket")
        self.server = url.rstrip("/") if url else f"unix:{socket}"
        """Where the vLLM server listens, for messages."""
        self.launcher = launcher
        self.http = EngineHTTP(
            url or "http://localhost",
            engine="vLLM",
            where=self.server,
            socket=socket,
            token=lambda: self.launcher.api_key if self.launcher else os.environ.get(API_KEY_ENV),
            error_message=_error_message,
            concurrency=concurrency,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
        )
        self.weight_version = "default"
        self.model_path: str | None = None
        self.served_model: str | None = None
        self.lora_name: str | None = None
        """The LoRA adapter every request is served with (the one loaded last), or None."""
        self.released: set[str] = set()
        """vLLM's sleep tags whose memory is given up (``weights``, ``kv_cache``): the engine is paused."""
        self._broadcast: Any = None
        self._launched = False
        self._said_no_checksums = False

    def __repr__(self) -> str:
        return f"VLLMClient({self.server})"

    # ---------------------------------------------------------------- transport

    async def start(self) -> None:
        if self.launcher is not None and not self._launched:
            await self.launcher.start()
            self._launched = True
        models = (await self._call("GET", "/v1/models")).get("data") or []
        if not models or not isinstance(models[0], dict):
            raise EngineResponseError(f"{self.server}/v1/models lists no model: {models!r:.200}")
        self.served_model = str(models[0].get("id"))
        self.model_path = str(models[0].get("root") or self.served_model)
        reply = await self.http.request("GET", "/is_paused", ok=(404,))
        if reply.status_code == 404:
            raise EngineError(
                f"the vLLM server at {self.server} has no RL routes (/pause, /update_weights, "
                "/collective_rpc): start it with VLLM_SERVER_DEV_MODE=1"
            )

    async def _call(self, method: str, path: str, **options: Any) -> Any:
        """The answer's body as JSON (None for an empty one)."""
        reply = await self.http.request(method, path, **options)
        return reply.json() if reply.text else None

    # ---------------------------------------------------------------- generation

    def _model(self, payload: dict[str, Any]) -> str | None:
        name = payload.get("lora_path") or self.lora_name
        return str(name) if name else None

    async def generate(self, payload: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        items = split_batch(payload) if isinstance(payload, dict) else None
        if items is None:
            return await self._generate_one(payload)
        return list(await asyncio.gather(*(self._generate_one(item) for item in items)))

    async def _generate_one(self, payload: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(payload, dict):
            raise EngineRequestError(f"a /generate body is a JSON object, got {type(payload).__name__}")
        request = completion_request(payload, str(payload.get("rid") or new_rid()), self._model(payload))
        async with self.http.slots:
            answer = await self._call("POST", "/v1/completions", body=request.body)
        source = f"{self.server}/v1/completions"
        choice = _one_choice(answer, source)
        done = Accumulated()
        done.add(choice, request, source)
        usage = answer.get("usage") or {}
        done.prompt_tokens = done.prompt_tokens or usage.get("prompt_tokens")
        return sglang_response(done, request, self.weight_version, choice.get("prompt_logprobs"))

    async def generate_stream(self, payload: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """vLLM streams deltas (``data: {...}`` lines, then ``data: [DONE]``); each is added up into SGLang's
        cumulative answer."""
        request = completion_request(
            payload, str(payload.get("rid") or new_rid()), self._model(payload), stream=True
        )
        source = f"{self.server}/v1/completions (stream)"
        done = Accumulated()
        async for chunk in self.http.events("/v1/completions", request.body, "a completion chunk"):
            if "error" in chunk:
                raise EngineError(f"{source}: {chunk['error']}")
            if not chunk.get("choices"):
                continue  # the usage chunk
            done.add(_one_choice(chunk, source), request, source)
            yield sglang_response(done, request, self.weight_version)

    # ---------------------------------------------------------------- control

    async def abort(self, rid: str | None = None) -> None:
        body = {"request_ids": [] if rid is None else [vllm_request_id(rid)]}
        await self.http.request("POST", "/abort_requests", body=body)

    async def load(self) -> dict[str, int]:
        return prometheus_load((await self.http.request("GET", "/metrics")).text)

    async def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "is_generation": True,
            "weight_version": self.weight_version,
            "served_model_name": self.served_model,
            "engine": "vllm",
        }

    async def pause(self, mode: str = "abort") -> None:
        if mode not in PAUSE_MODES:
            raise EngineRequestError(
                f"vLLM 0.26 cannot pause with mode {mode!r} (its /pause takes abort, keep and wait: rlsdk's "
                "abort and in_place)"
            )
        await self.http.request("POST", "/pause", query={"mode": PAUSE_MODES[mode]})

    async def resume(self) -> None:
        if self.released:
            raise EngineError(
                f"{self.server}: resume while its {', '.join(sorted(self.released))} memory is released "
                "(resume_memory first)"
            )
        await self.http.request("POST", "/resume")

    async def flush_cache(self) -> bool:
        return bool((await self._call("POST", "/reset_prefix_cache")).get("success"))

    async def update_weight_version(self, version: str) -> None:
        """vLLM keeps no weight version: the client's, reported in :meth:`model_info` and every answer."""
        self.weight_version = version

    # ---------------------------------------------------------------- weights from disk

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> None:
        """Every worker reloads the Hugging Face folder ``model_path`` (``reload_weights`` through
        ``/collective_rpc``), the requests in flight aborted first (as SGLang's sequence: pause, update,
        continue) and the prefix cache dropped after."""
        await self.pause("abort")
        try:
            await self._collective_rpc("reload_weights", {"weights_path": model_path})
            await self.flush_cache()
        finally:
            await self.resume()
        if weight_version is not None:
            self.weight_version = weight_version

    async def _collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None) -> list[Any]:
        body: dict[str, Any] = {"method": method}
        if kwargs:
            body["kwargs"] = kwargs
        answer = await self._call("POST", "/collective_rpc", body=body, retry=False)
        return list((answer or {}).get("results") or [])

    # ---------------------------------------------------------------- GPU memory and weight transfer

    async def release_memory(self, tags: list[str] | None = None) -> None:
        """``/sleep?level=2``: weights and KV cache dropped (the trainer's weights come back by
        :meth:`update_weights_from_tensor`), requests in flight aborted. vLLM sleeps whole: only all tags."""
        if tags is not None and {RESUMED_BY.get(t, t) for t in tags} != {"weights", "kv_cache"}:
            raise EngineRequestError(f"vLLM 0.26 releases its memory whole, not {tags}")
        await self.http.request("POST", "/sleep", query={"level": 2, "mode": "abort"})
        self.released = {"weights", "kv_cache"}

    async def resume_memory(self, tags: list[str] | None = None) -> None:
        """``/wake_up`` with the vLLM tags of ``tags`` (None: all); vLLM schedules again once all are back."""
        wanted = sorted({RESUMED_BY[t] for t in tags} if tags is not None else {"weights", "kv_cache"})
        unknown = sorted(set(tags or ()) - set(RESUMED_BY))
        if unknown:
            raise EngineRequestError(f"vLLM has no memory tag {unknown[0]!r} (it has weights and kv_cache)")
        await self.http.request("POST", "/wake_up", query=[("tags", t) for t in wanted])
        self.released -= set(wanted)

    async def update_weights_from_tensor(
        self, buckets: AsyncIterator[tuple[Any, bool]], weight_version: str, flush_cache: bool = True
    ) -> None:
        """Each bucket as one CUDA-IPC handle of its bytes, keyed by the GPU's UUID, pickled (vLLM's IPC
        backend: ``packed`` with ``tensor_sizes``; the server needs ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``)."""
        from .transfer import aligned, ipc_update_info

        async def send(flat: Any, last: bool) -> None:
            for part in aligned(flat):
                info = await asyncio.to_thread(ipc_update_info, part)
                await self._call("POST", "/update_weights", body={"update_info": info}, retry=False)

        await self._update(buckets, send, weight_version, flush_cache)

    async def join_weight_broadcast(self, master_address: str, backend: str = "nccl") -> None:
        """``/init_weight_transfer_engine`` (vLLM's workers take ranks 1..N of the group) while this process
        opens it as rank 0 (:func:`.transfer.open_group`: vLLM's own rendezvous)."""
        if self._broadcast is not None:
            return
        if backend != "nccl":
            raise EngineRequestError(f"vLLM's weight transfer group is NCCL only, not {backend!r}")
        from .transfer import open_group

        workers = int(
            (await self._call("GET", "/get_world_size", query={"include_dp": "true"}))["world_size"]
        )
        port = free_port(master_address)
        init = {
            "master_address": master_address,
            "master_port": port,
            "rank_offset": 1,
            "world_size": workers + 1,
        }
        self._broadcast, _ = await asyncio.gather(
            asyncio.to_thread(open_group, master_address, port, workers + 1),
            self._call("POST", "/init_weight_transfer_engine", body={"init_info": init}, retry=False),
        )

    async def update_weights_from_distributed(
        self, buckets: AsyncIterator[tuple[Any, bool]], weight_version: str
    ) -> None:
        """Each bucket announced (``/update_weights`` with its names, dtypes and shapes, ``packed`` in one
        buffer of its size) while this process broadcasts its bytes."""
        from .transfer import aligned, nccl_update_info

        group = self._broadcast
        if group is None:
            raise EngineError(f"{self.server}: join_weight_broadcast before update_weights_from_distributed")

        async def send(flat: Any, last: bool) -> None:
            for part in aligned(flat):
                announce = self._call(
                    "POST", "/update_weights", body={"update_info": nccl_update_info(part)}, retry=False
                )
                await asyncio.gather(asyncio.to_thread(group.broadcast, part.flat), announce)

        await self._update(buckets, send, weight_version, flush_cache=True)

    async def _update(
        self, buckets: AsyncIterator[tuple[Any, bool]], send: Any, weight_version: str, flush_cache: bool
    ) -> None:
        """``/start_weight_update``, ``send`` each bucket, ``/finish_weight_update``, paused (``keep``) unless
        asleep: between start and finish vLLM's layers are on the meta device. Then the prefix cache is
        dropped with ``reset_running_requests``: the requests kept in place lose their cache and vLLM computes
        it again under the new weights. An update that fails half way leaves the engine paused (its model is
        not whole)."""
        paused = not self.released
        if paused:
            await self.pause("in_place")
        await self._call("POST", "/start_weight_update", retry=False)
        async for flat, last in buckets:
            await send(flat, last)
            del flat
        await self._call("POST", "/finish_weight_update", retry=False)
        if flush_cache and not self.released:  # requests kept in place are recomputed with the new weights
            await self._call("POST", "/reset_prefix_cache", query={"reset_running_requests": "true"})
        self.weight_version = weight_version
        if paused:
            await self.resume()

    # ---------------------------------------------------------------- LoRA adapters

    async def load_lora_adapter(self, lora_name: str, lora_path: str) -> None:
        """``/v1/load_lora_adapter``; from then on every request is served with it (named as its ``model``)."""
        await self.http.request(
            "POST", "/v1/load_lora_adapter", body={"lora_name": lora_name, "lora_path": lora_path}
        )
        self.lora_name = lora_name

    async def unload_lora_adapter(self, lora_name: str) -> None:
        await self.http.request("POST", "/v1/unload_lora_adapter", body={"lora_name": lora_name})
        if self.lora_name == lora_name:
            self.lora_name = None

    # ---------------------------------------------------------------- trust

    async def weight_checksums(self) -> list[ServedChecksums] | None:
        """Every worker's checksums (:mod:`rlsdk_vllm_worker` through ``/collective_rpc``), by vLLM's own
        names and fusions; None where the server was started without that extension (said once)."""
        reply = await self.http.request(
            "POST",
            "/collective_rpc",
            body={"method": "rlsdk_weight_checksums"},
            ok=(400, 404, 500),
            retry=False,
        )
        status, text = reply.status_code, reply.text
        if status != 200:
            if not self._said_no_checksums:
                log.warning(
                    "%s has no weight checksums (%s: %s; rlsdk starts vLLM with --worker-extension-cls "
                    "rlsdk_vllm_worker.WeightChecksums): the trust check compares log-probs only",
                    self.server,
                    status,
                    text[:200],
                )
                self._said_no_checksums = True
            return None
        try:
            return [served_checksums(result, self.server) for result in json.loads(text)["results"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise EngineResponseError(
                f"{self.server}/collective_rpc rlsdk_weight_checksums: {exc}: {text[:200]!r}"
            ) from None

    async def health_problem(self, timeout: float) -> str | None:
        """None while the engine is healthy (the server it launched runs and answers ``/health`` within
        ``timeout`` seconds); else what is wrong. A launched server that exited is stopped (its whole group)."""
        if exited := await self._launched_exit():
            return exited
        problem = await self.http.health(timeout)
        if problem is None:
            return None
        # a killed server's socket refuses a moment before its exit shows: name the exit where there is one
        return await self._launched_exit(wait=EXIT_WAIT) or problem

    async def _launched_exit(self, wait: float = 0.0) -> str | None:
        """The launched server's exit (within ``wait`` seconds), its process group then stopped; None while it
        runs, or when this client launched none."""
        if self.launcher is None or not self._launched:
            return None
        deadline = asyncio.get_running_loop().time() + wait
        while not (exited := self.launcher.exited()) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        if exited:
            await asyncio.to_thread(self.launcher.stop)
            self._launched = False
        return exited

    async def close(self) -> None:
        await self.http.close()
        if self._broadcast is not None:
            await asyncio.to_thread(self._broadcast.close)
            self._broadcast = None
        if self.launcher is not None:  # started or not: its socket's folder goes too
            await asyncio.to_thread(self.launcher.stop)
            self._launched = False


def _one_choice(answer: Any, source: str) -> dict[str, Any]:
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise EngineResponseError(f"{source}: expected one choice, got {answer!r:.300}")
    return choices[0]


def _error_message(body: Any) -> Any:
    """vLLM's error answers: ``{"error": {"message", "type", "param", "code"}}`` (the OpenAI routes) or
    ``{"error": "..."}`` (the RL routes)."""
    error = body.get("error")
    return error.get("message") if isinstance(error, dict) else error


def prometheus_load(text: str) -> dict[str, int]:
    """Running and waiting requests from vLLM's Prometheus text (summed over its engines)."""
    names = {"vllm:num_requests_running": "num_running_reqs", "vllm:num_requests_waiting": "num_waiting_reqs"}
    load = dict.fromkeys(names.values(), 0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            load[names[name]] += int(float(line.rsplit(" ", 1)[1]))
    return load


def served_checksums(result: Any, server: str) -> ServedChecksums:
    """One worker's answer of :mod:`rlsdk_vllm_worker` as :class:`rlsdk.ServedChecksums`."""
    tp_rank, tp_size = int(result["tp_rank"]), int(result["tp_size"])
    holder = server if tp_size == 1 else f"{server} (tensor-parallel rank {tp_rank} of {tp_size})"
    fused = {str(k): tuple(str(p) for p in v) for k, v in result["fused"].items()}
    return ServedChecksums(holder, {str(k): str(v) for k, v in result["checksums"].items()}, fused, tp_size)
