"""Tinker's ``sample`` on rlsdk's engines (the embedded engine on the CPU; SGLang on GPUs), in SGLang's
protocol: ``num_samples`` requests with the sampler's weights, per-token log-probs, stop strings or token
ids, seeds, and the prompt's log-probs (with their top-k) from one scoring pass.

An engine serves one set of weights at a time (:class:`EngineSlot`): the base model, a LoRA adapter, or a
full fine-tune's weights. Requests for the weights it serves run together; a request for other weights
waits, in arrival order, until those finish, then the engine switches (an adapter is merged in or loaded
in place of the one before)."""

from __future__ import annotations

import asyncio
import hashlib
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engines.engine import InferenceEngine
from ..engines.protocol import EngineRequestError
from ..training.trainer import LoraAdapter
from .futures import UserError
from .wire import Sampled, SampleOutput

DEFAULT_MAX_TOKENS = 128
"""``max_new_tokens`` when a request's ``SamplingParams.max_tokens`` is None (SGLang's default)."""
MAX_SAMPLES = 256
MAX_TOP_K = 100


@dataclass
class SamplerWeights:
    """The weights a sampler serves: the base model (``key`` ``base``), a LoRA adapter, or a full
    fine-tune's weights; in this process (``adapter``/``full``) and/or as a folder (``folder``)."""

    key: str
    adapter: LoraAdapter | None = None
    full: dict[str, Any] | None = None
    folder: Path | None = None
    is_lora: bool = False

    @property
    def engine_name(self) -> str:
        """The adapter's name in the engine (``lora_path`` of its requests)."""
        return "tinker_" + hashlib.sha256(self.key.encode()).hexdigest()[:16]


BASE = SamplerWeights("base")


class EngineSlot:
    """An engine and the weights it serves (see the module's docstring)."""

    def __init__(self, engine: InferenceEngine) -> None:
        self.engine = engine
        self.current = BASE.key
        self.loaded_adapter: str | None = None
        self._active = 0
        self._tickets = 0
        self._waiting: list[tuple[int, str]] = []
        self._changed = asyncio.Condition()

    @asynccontextmanager
    async def serving(self, weights: SamplerWeights) -> AsyncIterator[InferenceEngine]:
        ticket = self._tickets
        self._tickets += 1
        self._waiting.append((ticket, weights.key))
        try:
            async with self._changed:
                await self._changed.wait_for(lambda: self._may_enter(ticket, weights.key))
                self._waiting.remove((ticket, weights.key))
                if self.current != weights.key:
                    await self._switch(weights)
                self._active += 1
        except BaseException:
            if (ticket, weights.key) in self._waiting:
                self._waiting.remove((ticket, weights.key))
            async with self._changed:
                self._changed.notify_all()
            raise
        try:
            yield self.engine
        finally:
            async with self._changed:
                self._active -= 1
                self._changed.notify_all()

    def _may_enter(self, ticket: int, key: str) -> bool:
        earlier = [k for t, k in self._waiting if t < ticket]
        if key == self.current:
            return all(k == key for k in earlier)
        return self._active == 0 and not earlier

    async def _switch(self, weights: SamplerWeights) -> None:
        engine = self.engine
        if self.loaded_adapter is not None:
            await engine.unload_lora_adapter(self.loaded_adapter)
            self.loaded_adapter = None
            self.current = BASE.key
        if weights.is_lora:
            name = weights.engine_name
            if weights.adapter is not None and engine.in_process_weights:
                await engine.load_lora_adapter_tensors(name, weights.adapter.config, weights.adapter.tensors)
            elif weights.folder is not None:
                await engine.load_lora_adapter(name, str(weights.folder))
            else:
                raise UserError(
                    f"the weights of sampler {weights.key} were released: a model keeps those of its latest "
                    "samplers only; save_weights_for_sampler(name) keeps weights for good"
                )
            self.loaded_adapter = name
        elif weights.key != BASE.key:
            if weights.full is not None and engine.in_process_weights:
                await engine.update_weights(weights.full, weights.key)
            elif weights.folder is not None:
                await engine.update_weights_from_disk(str(weights.folder), weights.key)
            else:
                raise UserError(
                    f"the weights of sampler {weights.key} were released: a full fine-tune keeps those of its "
                    "latest sampler only; save_weights_for_sampler(name) keeps weights for good"
                )
        await engine.flush_cache()
        self.current = weights.key

    def replica(self, session: str) -> InferenceEngine:
        """The engine replica a sampling session's requests go to, always the same one (its prefix cache)."""
        replicas = self.engine.replicas()
        return replicas[zlib.crc32(session.encode()) % len(replicas)]


def engine_params(params: Any) -> dict[str, Any]:
    """SGLang ``sampling_params`` for Tinker's ``SamplingParams``. ``stop``: strings or token ids (the end of
    sequence token still stops), ``[]`` stops at nothing but ``max_tokens``."""
    out: dict[str, Any] = {
        "max_new_tokens": DEFAULT_MAX_TOKENS if params.max_tokens is None else params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
    }
    stop = params.stop
    if isinstance(stop, str):
        out["stop"] = [stop]
    elif stop is not None and len(stop) == 0:
        out["ignore_eos"] = True
    elif stop is not None and all(isinstance(s, str) for s in stop):
        out["stop"] = list(stop)
    elif stop is not None:
        out["stop_token_ids"] = [int(s) for s in stop]
    return out


def check_request(request: Any) -> list[int]:
    """The prompt's token ids, after refusing what this server does not compute (naming the field)."""
    if not 1 <= request.num_samples <= MAX_SAMPLES:
        raise UserError(f"num_samples: 1 to {MAX_SAMPLES}, got {request.num_samples}")
    unsupported = {
        "topk_sample_logprobs": request.topk_sample_logprobs,
        "target_prompt_logprobs": request.target_prompt_logprobs is not None,
        "prompt_alt_tokens_k": request.prompt_alt_tokens_k,
        "record_stability_info": bool(request.record_stability_info),
    }
    for name, asked in unsupported.items():
        if asked:
            raise UserError(f"{name}: not supported by this server (rlsdk's engines do not compute it)")
    if not 0 <= request.topk_prompt_logprobs <= MAX_TOP_K:
        raise UserError(f"topk_prompt_logprobs: 0 to {MAX_TOP_K}, got {request.topk_prompt_logprobs}")
    tokens: list[int] = []
    for i, chunk in enumerate(request.prompt.chunks):
        if getattr(chunk, "type", None) != "encoded_text":
            raise UserError(f"prompt.chunks[{i}]: {chunk.type} chunks are not supported (text only)")
        tokens.extend(int(t) for t in chunk.tokens)
    if not tokens:
        raise UserError("prompt: no tokens")
    last_n = request.prompt_logprobs_last_n
    if last_n is not None and not 1 <= last_n <= len(tokens) - 1:
        raise UserError(
            f"prompt_logprobs_last_n: 1 to {len(tokens) - 1} (the prompt's length - 1), got {last_n}"
        )
    return tokens


async def sample(
    slot: EngineSlot,
    weights: SamplerWeights,
    request: Any,
    prompt: list[int],
    session: str,
    default_seed: int | None = None,
) -> SampleOutput:
    """Answer a checked ``SampleRequest`` (``prompt`` from :func:`check_request`) with ``weights``; sample
    ``i`` is drawn with seed ``seed + i``, the request's or else ``default_seed`` (None: unseeded)."""
    params = engine_params(request.sampling_params)
    seed = request.sampling_params.seed if request.sampling_params.seed is not None else default_seed
    want_prompt = bool(request.prompt_logprobs) or request.topk_prompt_logprobs > 0
    async with slot.serving(weights):
        engine = slot.replica(session)
        base: dict[str, Any] = {"input_ids": prompt, "return_logprob": True}
        if weights.is_lora:
            base["lora_path"] = weights.engine_name
        payloads = []
        for i in range(request.num_samples):
            sampling = dict(params)
            if seed is not None:
                sampling["sampling_seed"] = (seed + i) % 2**63
            payloads.append({**base, "sampling_params": sampling})
        calls = [engine.generate(p) for p in payloads]
        if want_prompt:
            score = {
                **base,
                "logprob_start_len": 0,
                "sampling_params": {"max_new_tokens": 0, "temperature": 1.0},
            }
            if request.topk_prompt_logprobs:
                score["top_logprobs_num"] = request.topk_prompt_logprobs
            calls.append(engine.generate(score))
        try:
            responses: list[Any] = list(await asyncio.gather(*calls))
        except EngineRequestError as exc:
            raise UserError(str(exc)) from None
    output = SampleOutput([_sampled(r) for r in responses[: request.num_samples]])
    if want_prompt:
        meta = responses[-1]["meta_info"]
        logprobs = [entry[0] for entry in meta["input_token_logprobs"]]
        top = meta.get("input_top_logprobs") or [None] * len(logprobs)
        keep = len(prompt) - (request.prompt_logprobs_last_n or len(prompt))
        if request.prompt_logprobs:
            output.prompt_logprobs = [None if i < keep else lp for i, lp in enumerate(logprobs)]
        if request.topk_prompt_logprobs:
            output.topk_width = request.topk_prompt_logprobs
            output.topk_prompt_logprobs = [
                None if i < keep or row is None else [(int(e[1]), float(e[0])) for e in row]
                for i, row in enumerate(top)
            ]
    return output


def _sampled(response: Any) -> Sampled:
    meta = response["meta_info"]
    finish = (meta.get("finish_reason") or {}).get("type")
    if finish == "abort":
        raise RuntimeError(f"the engine aborted the request: {meta['finish_reason'].get('message', '')}")
    entries = meta.get("output_token_logprobs") or []
    return Sampled(
        tokens=[int(e[1]) for e in entries],
        logprobs=[float(e[0]) for e in entries],
        stopped=finish == "stop",
    )
