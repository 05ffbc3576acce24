"""A stand-in for a vLLM 0.26.0 server, for tests where vLLM cannot run (no CUDA): its routes and answers
restated from its source (``vllm/entrypoints``, ``vllm/distributed/weight_transfer``; the shapes are pinned
by rlsdk's ``tests/fixtures/vllm-0.26.0-*.json``), in front of a real rlsdk engine (the embedded engine on
a small model), so that what comes back (tokens, log-probs, the weights served after a sync) is real. Not a
server for runs: it exists to test the vllm engine, and generators that use it, on a CPU.

What it restates:

- ``POST /v1/completions`` for token-id or text prompts with ``return_token_ids``, ``logprobs: 0`` (the
  sampled token's own; the stand-in gives no top-k), ``prompt_logprobs: 0`` and ``stream`` (deltas, then
  ``data: [DONE]``); ``request_id`` R names the request ``cmpl-R-0``; ``model`` is the base model or a loaded
  adapter (else 404); ``finish_reason`` ``stop`` with ``stop_reason`` the stop string, the stop token id, or
  null for EOS; ``length``; ``abort``. Without ``max_tokens`` vLLM stops at 16. The routes under ``/v1`` take
  the API key when one is set (401 ``{"error": "Unauthorized"}``); the others never do;
- with ``dev_mode`` (``VLLM_SERVER_DEV_MODE=1``): ``/abort_requests``, ``/pause?mode=abort|keep|wait``,
  ``/resume``, ``/is_paused``, ``/sleep?level=&mode=``, ``/wake_up?tags=`` (the scheduler resumes once every
  tag is awake), ``/is_sleeping``, ``/reset_prefix_cache`` (``success`` false while requests hold the cache),
  ``/collective_rpc`` (``reload_weights`` with ``weights_path``; rlsdk's ``rlsdk_weight_checksums`` when
  started with its worker extension: the tensors a vLLM Llama holds, ``q_proj``/``k_proj``/``v_proj`` fused
  into ``qkv_proj`` and ``gate_proj``/``up_proj`` into ``gate_up_proj``; any other method: 500),
  ``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``
  (IPC: ``ipc_handles_pickled`` only with ``VLLM_ALLOW_INSECURE_SERIALIZATION``; the packed buffer cut by
  ``tensor_sizes``), ``/get_world_size``; without: 404 ``{"detail": "Not Found"}``;
- with ``lora`` (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``): ``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``;
- ``/v1/models``, ``/health``, ``/version``, ``/metrics`` (running and waiting requests).

Where the stand-in differs, because no GPU is here, and says so:

- a ``sleep`` at level 2 discards the weights: woken without an update, the engine serves zeros;
- IPC handles keyed ``"cpu"`` hold the tensor itself (pickled by value), in place of a GPU UUID's
  ``rebuild_cuda_tensor`` arguments; NCCL (``nccl``) transfer is not stood in for (501);
- between ``/start_weight_update`` and ``/finish_weight_update`` vLLM's layers are on the meta device and a
  step would fail: the stand-in refuses to start an update while it is scheduling (not paused or asleep),
  to catch a client that forgets to pause;
- prompt log-probs carry no rank (``null``); the base model and adapters are not served side by side: the
  embedded engine merges the adapter it loaded last;
- ``/reset_prefix_cache?reset_running_requests=true`` succeeds, as vLLM's does by preempting the running
  requests, but the embedded engine keeps their cache (vLLM computes it again).
"""

from __future__ import annotations

import asyncio
import base64
import json
import pickle
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import torch
from aiohttp import web
from torch.multiprocessing.reductions import rebuild_tensor
from rlsdk.engine_api import EngineRequestError, tensor_checksum

ROUTES_DEV = (
    "/abort_requests",
    "/pause",
    "/resume",
    "/is_paused",
    "/sleep",
    "/wake_up",
    "/is_sleeping",
    "/reset_prefix_cache",
    "/collective_rpc",
    "/init_weight_transfer_engine",
    "/start_weight_update",
    "/update_weights",
    "/finish_weight_update",
    "/get_world_size",
)
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
"""A vLLM Llama's ``packed_modules_mapping``."""


def error(message: str, kind: str, code: int, param: str | None = None) -> web.Response:
    """vLLM's ``ErrorResponse``."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=code)


@dataclass
class State:
    """What the server is doing, and what it was asked (``calls``, in order)."""

    paused: str | None = None
    asleep: set[str] = field(default_factory=set)
    discarded: bool = False
    updating: bool = False
    received: dict[str, torch.Tensor] = field(default_factory=dict)
    loras: dict[str, str] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    dead: bool = False


@dataclass
class FakeVLLM:
    """The restated server in front of ``engine`` (started, serving the model at the path ``model``)."""

    engine: Any
    model: str
    _: KW_ONLY
    api_key: str | None = None
    dev_mode: bool = True
    lora: bool = True
    weight_transfer: str | None = "ipc"
    sleep_mode: bool = True
    worker_extension: bool = True
    state: State = field(default_factory=State, init=False)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=1 << 30)
        routes = [
            web.get("/health", self.health),
            web.get("/version", self.version),
            web.get("/v1/models", self.models),
            web.get("/metrics", self.metrics),
            web.post("/v1/completions", self.completions),
        ]
        if self.dev_mode:
            routes += [
                web.post("/abort_requests", self.abort_requests),
                web.post("/pause", self.pause),
                web.post("/resume", self.resume),
                web.get("/is_paused", self.is_paused),
                web.post("/sleep", self.sleep),
                web.post("/wake_up", self.wake_up),
                web.get("/is_sleeping", self.is_sleeping),
                web.post("/reset_prefix_cache", self.reset_prefix_cache),
                web.post("/collective_rpc", self.collective_rpc),
                web.post("/init_weight_transfer_engine", self.init_transfer),
                web.post("/start_weight_update", self.start_update),
                web.post("/update_weights", self.update_weights),
                web.post("/finish_weight_update", self.finish_update),
                web.get("/get_world_size", self.world_size),
            ]
        if self.lora:
            routes += [
                web.post("/v1/load_lora_adapter", self.load_lora),
                web.post("/v1/unload_lora_adapter", self.unload_lora),
            ]
        app.add_routes(routes)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        """The API key on ``/v1``, ``/v2`` and ``/inference`` only (vLLM's AuthenticationMiddleware); FastAPI's
        404 for a route the server does not have."""
        if self.api_key and request.path.startswith(("/v1", "/v2", "/inference")):
            if request.headers.get("Authorization") != f"Bearer {self.api_key}":
                return web.json_response({"error": "Unauthorized"}, status=401)
        self.state.calls.append(request.path + (f"?{request.query_string}" if request.query_string else ""))
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return web.json_response({"detail": "Not Found"}, status=404)

    # ------------------------------------------------------------------ OpenAI routes

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.state.dead else 200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.26.0"})

    def _card(self, name: str, root: str, parent: str | None, max_len: int | None) -> dict[str, Any]:
        permission = {
            "id": f"modelperm-{uuid.uuid4().hex}",
            "object": "model_permission",
            "created": int(time.time()),
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
        return {
            "id": name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": root,
            "parent": parent,
            "max_model_len": max_len,
            "permission": [permission],
        }

    async def models(self, request: web.Request) -> web.Response:
        cards = [self._card(self.model, self.model, None, 8192)]
        cards += [self._card(name, path, self.model, None) for name, path in self.state.loras.items()]
        return web.json_response({"object": "list", "data": cards})

    async def metrics(self, request: web.Request) -> web.Response:
        load = await self.engine.load()
        labels = f'engine="0",model_name="{self.model}"'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} {float(load['num_running_reqs'])}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{labels}}} {float(load['num_waiting_reqs'])}",
            f'vllm:num_requests_waiting_by_reason{{{labels},reason="capacity"}} {float(load["num_waiting_reqs"])}',
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    def _sglang_payload(self, body: dict[str, Any], rid: str) -> dict[str, Any]:
        """The request as the embedded engine's (SGLang's) ``/generate`` body."""
        prompt = body.get("prompt")
        payload: dict[str, Any] = {"rid": rid}
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and t >= 0 for t in prompt):
            payload["input_ids"] = prompt
        elif isinstance(prompt, str) and prompt:
            payload["text"] = prompt
        else:
            raise ValueError("prompt")
        params: dict[str, Any] = {"max_new_tokens": body.get("max_tokens", 16)}
        for theirs, ours in (
            ("temperature", "temperature"),
            ("top_p", "top_p"),
            ("top_k", "top_k"),
            ("min_p", "min_p"),
            ("stop", "stop"),
            ("stop_token_ids", "stop_token_ids"),
            ("ignore_eos", "ignore_eos"),
            ("min_tokens", "min_new_tokens"),
            ("include_stop_str_in_output", "no_stop_trim"),
            ("skip_special_tokens", "skip_special_tokens"),
        ):
            if body.get(theirs) is not None:
                params[ours] = body[theirs]
        if params.get("top_k") == 0:
            params["top_k"] = -1
        payload["sampling_params"] = params
        if body.get("logprobs") is not None:
            payload["return_logprob"] = True
        model = body.get("model")
        if model and model != self.model:
            payload["lora_path"] = model
        return payload

    async def _prompt_logprobs(self, payload: dict[str, Any]) -> list[Any]:
        """vLLM's ``prompt_logprobs``: null for the first token, then ``{token: {logprob, rank, decoded_token}}``."""
        scored = await self.engine.generate(
            {
                **{k: v for k, v in payload.items() if k in ("input_ids", "text", "lora_path")},
                "rid": f"{payload['rid']}-score",
                "return_logprob": True,
                "logprob_start_len": 0,
                "sampling_params": {"max_new_tokens": 0, "temperature": 1.0},
            }
        )
        entries = scored["meta_info"]["input_token_logprobs"]
        out: list[Any] = [None]
        for logprob, token, _ in entries[1:]:
            text = self.engine.tokenizer.decode([token])
            out.append(
                {str(token): {"logprob": max(float(logprob), -9999.0), "rank": None, "decoded_token": text}}
            )
        return out

    def _choice(
        self, response: dict[str, Any], body: dict[str, Any], prompt_ids: list[int], text_offset: int = 0
    ) -> dict[str, Any]:
        meta = response["meta_info"]
        ids = response["output_ids"]
        finish = meta.get("finish_reason")
        reason, stop_reason = None, None
        if finish is not None:
            reason = finish["type"]
            matched = finish.get("matched")
            if reason == "stop" and (
                isinstance(matched, str) or matched in (body.get("stop_token_ids") or [])
            ):
                stop_reason = matched
        logprobs = None
        if body.get("logprobs") is not None:
            tokens = [self.engine.tokenizer.decode([t]) for t in ids]
            values = [max(float(e[0]), -9999.0) for e in meta["output_token_logprobs"]]
            offsets, at = [], text_offset
            for token in tokens:
                offsets.append(at)
                at += len(token)
            logprobs = {
                "text_offset": offsets,
                "token_logprobs": values,
                "tokens": tokens,
                "top_logprobs": [{t: v} for t, v in zip(tokens, values, strict=True)],
            }
        return {
            "index": 0,
            "text": response["text"],
            "logprobs": logprobs,
            "finish_reason": reason,
            "stop_reason": stop_reason,
            "token_ids": list(ids) if body.get("return_token_ids") else None,
            "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids if body.get("return_token_ids") else None,
            "routed_experts": None,
        }

    async def completions(self, request: web.Request) -> web.StreamResponse:
        if self.state.dead:
            return error("EngineCore encountered an issue.", "InternalServerError", 500)
        try:
            body = await request.json()
        except ValueError:
            return error("JSON decode error", "Bad Request", 400)
        model = body.get("model")
        if model is not None and model != self.model and model not in self.state.loras:
            return error(f"The model `{model}` does not exist.", "NotFoundError", 404, "model")
        logprobs = body.get("logprobs")
        if logprobs not in (None, 0):
            return error(
                "the stand-in gives the sampled token's log-prob only (logprobs 0)",
                "NotImplementedError",
                501,
            )
        if body.get("stream") and body.get("prompt_logprobs"):
            return error(
                "`prompt_logprobs` are not available when `stream=True`.",
                "BadRequestError",
                400,
                "prompt_logprobs",
            )
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return error(
                f"max_tokens must be at least 1, got {max_tokens}.", "BadRequestError", 400, "max_tokens"
            )
        request_id = str(body.get("request_id") or uuid.uuid4().hex)
        rid = f"cmpl-{request_id}-0"
        try:
            payload = self._sglang_payload(body, rid)
        except ValueError:
            return error("1 validation error:\n  prompt", "Bad Request", 400, "prompt")
        prompt_ids = payload.get("input_ids") or list(
            self.engine.tokenizer(payload["text"], add_special_tokens=True)["input_ids"]
        )
        if body.get("stream"):
            return await self._stream(request, body, payload, prompt_ids, request_id)
        try:
            response = await self.engine.generate(payload)
        except EngineRequestError as exc:
            return error(str(exc), "BadRequestError", 400)
        choice = self._choice(response, body, prompt_ids)
        if body.get("prompt_logprobs") is not None:
            choice["prompt_logprobs"] = await self._prompt_logprobs(payload)
        completion = len(response["output_ids"])
        return web.json_response(
            {
                "id": f"cmpl-{request_id}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": model or self.model,
                "choices": [choice],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": {
                    "prompt_tokens": len(prompt_ids),
                    "total_tokens": len(prompt_ids) + completion,
                    "completion_tokens": completion,
                    "prompt_tokens_details": None,
                },
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": None,
            }
        )

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        payload: dict[str, Any],
        prompt_ids: list[int],
        rid: str,
    ) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        sent_ids, sent_text, first = 0, 0, True
        async for cumulative in self.engine.generate_stream(payload):
            ids = cumulative["output_ids"]
            meta = cumulative["meta_info"]
            finish = meta.get("finish_reason")
            if len(ids) == sent_ids and finish is None:
                continue
            delta = {
                **cumulative,
                "text": cumulative["text"][sent_text:],
                "output_ids": ids[sent_ids:],
                "meta_info": {
                    **meta,
                    "output_token_logprobs": (meta.get("output_token_logprobs") or [])[sent_ids:],
                },
            }
            choice = self._choice(delta, body, prompt_ids, text_offset=sent_text)
            del choice["prompt_logprobs"], choice["routed_experts"]
            choice["prompt_token_ids"] = prompt_ids if first and body.get("return_token_ids") else None
            order = (
                "index",
                "text",
                "logprobs",
                "finish_reason",
                "stop_reason",
                "prompt_token_ids",
                "token_ids",
            )
            chunk = {
                "id": f"cmpl-{rid}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body.get("model") or self.model,
                "choices": [{key: choice[key] for key in order}],
            }
            await out.write(f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode())
            sent_ids, sent_text, first = len(ids), len(cumulative["text"]), False
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out

    # ------------------------------------------------------------------ RL routes (VLLM_SERVER_DEV_MODE=1)

    async def abort_requests(self, request: web.Request) -> web.Response:
        ids = (await request.json()).get("request_ids")
        if ids:
            for rid in ids:
                await self.engine.abort(rid)
            return web.json_response({"status": "aborted", "aborted": len(ids)})
        load = await self.engine.load()
        await self.engine.abort()
        return web.json_response(
            {"status": "aborted", "aborted": load["num_running_reqs"] + load["num_waiting_reqs"]}
        )

    async def pause(self, request: web.Request) -> web.Response:
        mode = request.query.get("mode", "abort")
        if mode not in ("abort", "wait", "keep"):
            message = (
                "1 validation error:\n  {'type': 'literal_error', 'loc': ('query', 'mode'), 'msg': \"Input should be "
                f"'abort', 'wait' or 'keep'\", 'input': '{mode}'}}"
            )
            return error(message, "Bad Request", 400, "mode")
        if mode == "wait":
            await self.engine.wait_idle()
        await self.engine.pause("abort" if mode == "abort" else "in_place")
        self.state.paused = mode
        return web.json_response({"status": "paused"})

    async def is_paused(self, request: web.Request) -> web.Response:
        return web.json_response({"is_paused": self.state.paused is not None})

    async def world_size(self, request: web.Request) -> web.Response:
        return web.json_response({"world_size": 1})

    async def resume(self, request: web.Request) -> web.Response:
        if self.state.asleep:  # vLLM would step with its memory released: its engine dies
            self.state.dead = True
        self.state.paused = None
        await self.engine.resume()
        return web.json_response({"status": "resumed"})

    async def sleep(self, request: web.Request) -> web.Response:
        if not self.sleep_mode:
            return error("Sleep mode is not enabled.", "InternalServerError", 500)
        level, mode = int(request.query.get("level", "1")), request.query.get("mode", "abort")
        await self.engine.pause("abort" if mode == "abort" else "in_place")
        if level >= 1:
            self.state.asleep = {"weights", "kv_cache"}
            self.state.discarded = level >= 2
        self.state.paused = self.state.paused or mode
        return web.Response(status=200)

    async def wake_up(self, request: web.Request) -> web.Response:
        tags = request.query.getall("tags", []) or ["weights", "kv_cache"]
        if "weights" in tags and "weights" in self.state.asleep and self.state.discarded:
            state = (
                self.engine.model.state_dict()
            )  # level 2 kept nothing: the memory comes back uninitialised
            await self.engine.update_weights({k: torch.zeros_like(v) for k, v in state.items()})
            self.state.discarded = False
        self.state.asleep -= set(tags)
        if not self.state.asleep and self.state.paused is not None:
            self.state.paused = None
            await self.engine.resume()
        return web.Response(status=200)

    async def is_sleeping(self, request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": bool(self.state.asleep) or self.state.paused is not None})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        if request.query.get("reset_running_requests") == "true":  # vLLM preempts them: it always succeeds
            return web.json_response({"success": True})
        return web.json_response({"success": bool(await self.engine.flush_cache())})

    async def collective_rpc(self, request: web.Request) -> web.Response:
        body = await request.json()
        method = body.get("method")
        if method is None:
            return error("Missing 'method' in request body", "Bad Request", 400)
        kwargs = body.get("kwargs") or {}
        if method == "reload_weights":
            await self.engine.update_weights_from_disk(kwargs["weights_path"])
            return web.json_response({"results": [None]})
        if method == "rlsdk_weight_checksums" and self.worker_extension:
            held = self._held()
            return web.json_response(
                {
                    "results": [
                        {
                            "checksums": {name: tensor_checksum(t) for name, t in held.items()},
                            "fused": {f".{k}.": [f".{p}." for p in v] for k, v in FUSED.items()},
                            "tp_rank": 0,
                            "tp_size": 1,
                        }
                    ]
                }
            )
        return error(f"'Worker' object has no attribute '{method}'", "InternalServerError", 500)

    def _held(self) -> dict[str, torch.Tensor]:
        """The tensors a vLLM Llama holds: Hugging Face's, fused; a tied output head once."""
        state = self.engine.model.state_dict()
        seen: set[int] = set()
        held: dict[str, torch.Tensor] = {}
        for name, tensor in state.items():
            if tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
            held[name] = tensor
        for whole, parts in FUSED.items():
            for name in [n for n in held if f".{parts[0]}." in n]:
                names = [name.replace(f".{parts[0]}.", f".{p}.") for p in parts]
                held[name.replace(f".{parts[0]}.", f".{whole}.")] = torch.cat([held.pop(n) for n in names])
        return held

    def _no_transfer(self) -> web.Response | None:
        if self.weight_transfer is None:
            return error(
                "Weight transfer not configured. Please set weight_transfer_config to enable weight transfer.",
                "InternalServerError",
                500,
            )
        if self.weight_transfer != "ipc":
            return error("the stand-in has no NCCL: it needs GPUs", "NotImplementedError", 501)
        return None

    async def init_transfer(self, request: web.Request) -> web.Response:
        if (refused := self._no_transfer()) is not None:
            return refused
        return web.json_response({"message": "Weight transfer initialized"})

    async def start_update(self, request: web.Request) -> web.Response:
        if (refused := self._no_transfer()) is not None:
            return refused
        if self.state.paused is None and not self.state.asleep:
            return error(
                "the stand-in refuses a weight update while the engine schedules: vLLM's layers are on the meta "
                "device until /finish_weight_update",
                "InternalServerError",
                500,
            )
        self.state.updating, self.state.received = True, {}
        return web.json_response({"message": "Weight update started"})

    async def update_weights(self, request: web.Request) -> web.Response:
        if (refused := self._no_transfer()) is not None:
            return refused
        info = dict((await request.json())["update_info"])
        if not self.state.updating:
            return error(
                "start_weight_update must be called before update_weights.", "InternalServerError", 500
            )
        pickled = info.pop("ipc_handles_pickled", None)
        if pickled is None:
            return error(
                "Either `ipc_handles` or `ipc_handles_pickled` must be provided", "BadRequestError", 400
            )
        handles = pickle.loads(base64.b64decode(pickled))  # noqa: S301 (vLLM's own: VLLM_ALLOW_INSECURE_SERIALIZATION)
        packed = rebuild_tensor(*handles["cpu"])
        dtypes = [getattr(torch, name) for name in info["dtype_names"]]
        pieces = packed[: sum(info["tensor_sizes"])].split(info["tensor_sizes"])
        for name, shape, dtype, piece in zip(info["names"], info["shapes"], dtypes, pieces, strict=True):
            self.state.received[name] = piece.contiguous().view(dtype).view(*shape).clone()
        return web.json_response({"message": "Weights updated"})

    async def finish_update(self, request: web.Request) -> web.Response:
        if not self.state.updating:
            return error(
                "finish_weight_update called without a matching start_weight_update.",
                "InternalServerError",
                500,
            )
        state = {k: v.clone() for k, v in self.engine.model.state_dict().items()}
        state.update(self.state.received)  # a layer sent nothing keeps what it held
        await self.engine.update_weights(state)
        self.state.updating, self.state.received = False, {}
        return web.json_response({"message": "Weight update finished"})

    async def load_lora(self, request: web.Request) -> web.Response:
        body = await request.json()
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return error("Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput", 400)
        if name in self.state.loras and not body.get("load_inplace"):
            message = (
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, "
                "set 'load_inplace' to True."
            )
            return error(message, "InvalidUserInput", 400)
        await self.engine.load_lora_adapter(name, path)
        self.state.loras[name] = path
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora(self, request: web.Request) -> web.Response:
        name = (await request.json()).get("lora_name")
        if name not in self.state.loras:
            return error(f"The lora adapter '{name}' cannot be found.", "NotFoundError", 404)
        del self.state.loras[name]
        await self.engine.unload_lora_adapter(name)
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")


class ServedVLLM:
    """:class:`FakeVLLM` in front of ``engine``, served from an event loop of its own thread on loopback TCP, or
    on the Unix socket ``socket``::

        with ServedVLLM(EmbeddedEngine(model, device="cpu"), str(model)) as served:
            asyncio.run(VLLMClient(served.url).generate(...))
    """

    def __init__(self, engine: Any, model_path: str, socket: str | None = None, **options: Any) -> None:
        self.engine = engine
        self.fake = FakeVLLM(engine, model_path, **options)
        self.socket = socket
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-stand-in", daemon=True)

    @property
    def state(self) -> State:
        return self.fake.state

    def run(self, coroutine: Any, timeout: float = 300.0) -> Any:
        """Run ``coroutine`` on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _serve(self) -> None:
        self._runner = web.AppRunner(self.fake.app())
        await self._runner.setup()
        if self.socket:
            await web.UnixSite(self._runner, self.socket).start()
            self.url = f"unix:{self.socket}"
            return
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    def __enter__(self) -> ServedVLLM:
        self._thread.start()
        try:
            self.run(self.engine.start())
            self.run(self._serve())
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            self.run(self._runner.cleanup())
        self.run(self.engine.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()
