"""The embedded engine: SGLang's ``/generate`` answered in process by transformers, with continuous
batching over a KV cache, on CPU or CUDA."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlsdk.engine_api import (
    EngineError,
    EngineRequestError,
    InferenceEngine,
    ServedChecksums,
    finish_abort,
    finish_length,
    finish_stop,
    generate_response,
    lora_adapter_deltas,
    new_rid,
    read_lora_adapter,
    split_batch,
    tensor_checksum,
    tokenizer_fingerprint,
)

from . import attention
from .attention import full_attention_only
from .batch import KVBatch
from .model_files import resolve_model_path
from .sampling import BatchSampler, SamplingParams

_STOP_WINDOW = 8
MAX_CHARS_PER_TOKEN = 32
"""A ``text`` longer than the context times this is refused before tokenizing (tokens are far shorter)."""
INLINE_TOKENIZE_CHARS = 4096
"""A ``text`` up to this many characters is tokenized on the event loop (quicker than a thread hop)."""
MAX_TOP_LOGPROBS = 100
"""Most alternatives a scoring request's ``top_logprobs_num`` may ask for at each prompt position."""
"""Extra tokens decoded around a stop string's length when looking for it in new text."""


@dataclass
class _Request:
    """One request's state, from arrival to its response. ``output``, ``logprobs`` and ``finished``
    change only under the engine's lock; ``done`` and ``stream`` only on the event loop."""

    rid: str
    prompt: list[int]
    params: SamplingParams
    return_logprob: bool
    text_in_logprobs: bool
    done: asyncio.Future[dict[str, Any]]
    stream: asyncio.Queue[dict[str, Any] | EngineError] | None = None
    generator: torch.Generator | None = None
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    finished: bool = False


@dataclass
class _Launched:
    """A decode step on its way: its rows, and its tokens and log-probs being copied back from the
    device (``done`` is recorded after the copies; None on CPU, where they are ready)."""

    rows: list[_Request]
    tokens: torch.Tensor
    logprobs: torch.Tensor
    done: torch.cuda.Event | None


@dataclass
class EngineStats:
    """Counters that show batching at work; ``busy_seconds`` is the time spent in steps (forward pass,
    sampling and reading the tokens back), the rest of the engine thread's time is waiting or handing out."""

    steps: int = 0
    prefills: int = 0
    tokens: int = 0
    max_batch: int = 0
    busy_seconds: float = 0.0


def settle_future(job: Callable[[], Any], future: Future[Any]) -> None:
    """Run ``job`` and settle ``future`` with its result or exception (unless it was cancelled)."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = job()
    except BaseException as exc:  # noqa: BLE001 - the waiting coroutine re-raises it
        future.set_exception(exc)
    else:
        future.set_result(result)


def default_cpu_threads() -> int:
    """All cores but one: the event loop, the HTTP server and reward workers need one, and torch's
    spinning OpenMP threads slow down many times over when they share cores with other work."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


class EmbeddedEngine(InferenceEngine):
    """SmolLM2-135M-Instruct (default) or any local Hugging Face causal LM behind SGLang's protocol.

    Concurrent requests share one running batch: each iteration either prefills waiting requests and
    merges them into the batch, or decodes one token for every running row. At most
    ``max_batch_size`` rows run at once; the rest wait. The engine runs on its own thread: it steps
    while there are rows to run, whatever the event loop is busy with, and hands finished responses
    (and stream chunks) to the loop once per step. Weight updates and loading run on that thread too,
    between two steps.

    Log-probabilities are those of the distribution each token was drawn from: softmax of
    logits / temperature, restricted by top-k, top-p and min-p and renormalized; greedy requests
    (temperature 0) report the model's own log-softmax. In float32 they match a plain forward pass.
    ``pause("abort")`` (SGLang's default) aborts the requests in flight; ``in_place``/``retract`` keep
    them, with their cache, until :meth:`resume`. A weight update without a version sets
    ``weight_version`` to the number of updates so far.

    ``static_decode`` (default: on CUDA, for models whose layers all attend to the whole context) runs
    decode steps as :class:`~.static_decode.StaticDecode` steps replayed from CUDA graphs while the batch
    keeps its cache buffers; finished rows then stay in the batch (decoded, their tokens dropped) until
    a quarter of the rows have finished or new rows join, so that the graph lives on. Consecutive decode
    steps then overlap: a step is launched before the previous one's tokens are read back and recorded,
    so that the rows' Python bookkeeping runs while the device works (a row that finishes decodes one
    more token, which is dropped).
    """

    in_process_weights = True

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        device: str = "auto",
        dtype: str = "float32",
        max_batch_size: int = 64,
        max_prefill_tokens: int = 8192,
        cache_dir: str | os.PathLike[str] | None = None,
        threads: int | None = None,
        static_decode: bool | None = None,
    ) -> None:
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
        if device not in ("auto", "cpu", "cuda") and not device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.model_arg = model
        self.device_arg = device
        self.dtype = dtype
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.cache_dir = cache_dir
        self.threads = threads
        self.static_decode = static_decode
        self.url: str | None = None
        self.weight_version = "default"
        self.stats = EngineStats()
        self.tokenizer: Any = None
        """For the event loop's side (text prompts, the run's data); the engine thread decodes with its own."""
        self.model: Any = None
        self.model_path: Path | None = None
        self._detokenizer: Any = None
        self._config: Any = None
        """The model's config once :meth:`prepare` read it."""
        self._updates = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = False
        # Shared between the event loop and the engine thread, under the lock:
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._waiting: deque[_Request] = deque()
        self._joining: list[_Request] = []
        """Taken from ``_waiting`` for the prefill in progress."""
        self._rows: list[_Request] = []
        """Requests in the KV batch, in row order; finished ones leave at the next step."""
        self._jobs: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._paused = False
        self._closing = False
        # The engine thread's alone:
        self._loaded_batch: KVBatch | None = None
        self._sampler: BatchSampler | None = None
        self._launched: _Launched | None = None
        """The decode step launched last, not yet recorded (static decode only)."""
        self._eos: set[int] = set()
        self.lora_adapters: dict[str, str] = {}
        """The LoRA adapters loaded, name -> where they came from (a folder, or ``<tensors>``)."""
        self.lora_name: str | None = None
        """The adapter merged into the weights (the one loaded last): every request is served with it."""
        self._lora_deltas: dict[str, dict[str, torch.Tensor]] = {}
        self._lora_base: dict[str, torch.Tensor] = {}
        """The engine thread's: the original value of every weight an adapter changed."""
        self._kernels: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
        """Entered around every step: the SDPA kernels allowed on this device."""

    @property
    def _batch(self) -> KVBatch:
        """The running batch, from :meth:`_load` on."""
        assert self._loaded_batch is not None, "the embedded engine has not loaded its model"
        return self._loaded_batch

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="rlsdk-embedded", daemon=True)
        self._thread.start()
        try:
            await self._on_thread(self._load)
        except BaseException:
            await self._stop_thread()
            raise
        self._ready = True

    async def prepare(self) -> None:
        """All of :meth:`start` but the weights, ahead of it (a Ray standby engine does this while it
        waits): the model's files found, its tokenizers and config read, and its model class imported."""
        await asyncio.to_thread(self._prepare)

    def _prepare(self) -> None:
        if self._config is not None:
            return
        from transformers import AutoConfig, AutoTokenizer
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        self.model_path = resolve_model_path(self.model_arg, self.cache_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self._detokenizer = AutoTokenizer.from_pretrained(self.model_path)  # a Rust tokenizer is not shared
        config = AutoConfig.from_pretrained(self.model_path)
        MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)  # imports the model's module
        self._config = config

    def _load(self) -> None:
        from transformers import AutoModelForCausalLM

        self._prepare()
        assert self.model_path is not None  # _prepare found it
        device = self.device_arg
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu":  # on the thread that runs every forward pass (OpenMP settings are per thread)
            torch.set_num_threads(self.threads or default_cpu_threads())
        full = full_attention_only(self._config)
        static = full and (device.startswith("cuda") if self.static_decode is None else self.static_decode)
        # Eager decode steps on CUDA: SDPA's fused kernels beat the grouped products (18.0k against 15.1k
        # tokens/s on an H200). Static steps attend over whole buffers under a padding mask, where SDPA
        # copies every key/value head per query head and takes a slower kernel: the grouped products
        # there (4.9 against 15.6 ms of GPU time per step at batch 256 on an H100).
        grouped = full and (device == "cpu" or static)
        options = {"attn_implementation": attention.register()} if grouped else {}
        model = AutoModelForCausalLM.from_pretrained(
            self.model_path, config=self._config, dtype=getattr(torch, self.dtype), **options
        )
        # PreTrainedModel.to is wrapped by functools.wraps, whose typeshed type (_Wrapped) has no __get__:
        # mypy does not bind it to the model and takes ``device`` for ``self``
        self.model = model.to(device).eval()  # type: ignore[arg-type]
        if device == "cpu":  # own the weights: a map of the safetensors file would page-fault the first sync
            for parameter in self.model.parameters():
                parameter.data = parameter.data.clone()
        self._kernels = attention.sdpa_without_cudnn if device.startswith("cuda") else contextlib.nullcontext
        self._loaded_batch = KVBatch(self.model, boolean_decode_mask=grouped, static_decode=static)
        self._shared_generator = torch.Generator(device=self._batch.device)
        self._shared_generator.seed()
        eos = self.model.generation_config.eos_token_id if self.model.generation_config else None
        eos = eos if eos is not None else self.tokenizer.eos_token_id
        self._eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])

    async def close(self) -> None:
        if self._thread is None:
            return
        await self.abort()
        await self._stop_thread()

    async def _stop_thread(self) -> None:
        with self._work:
            self._closing = True
            self._work.notify()
        assert self._thread is not None
        await asyncio.to_thread(self._thread.join)
        self._thread = None
        self._ready = False

    async def _on_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the engine thread, before its next step."""
        future: Future[Any] = Future()
        with self._work:
            if self._closing:
                raise RuntimeError("the embedded engine is closed")
            self._jobs.append((functools.partial(fn, *args), future))
            self._work.notify()
        return await asyncio.wrap_future(future)

    # ---------------------------------------------------------------- requests

    async def generate(self, payload: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        items = split_batch(payload) if isinstance(payload, dict) else None
        if items is not None:
            prompts = [await self._prompt(item) for item in items]  # every item checked before any runs
            requests = [self._admit(item, prompt) for item, prompt in zip(items, prompts)]
            return list(await asyncio.gather(*(r.done for r in requests)))
        if isinstance(payload, dict) and payload.get("logprob_start_len", -1) not in (None, -1):
            return await self._score(payload)
        request = self._admit(payload, await self._prompt(payload))
        return await request.done

    async def _score(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Log-probs of the prompt's own tokens from ``logprob_start_len`` on (``input_token_logprobs``), as
        SGLang 0.5.17 answers ``max_new_tokens: 0`` with ``return_logprob``: the range's first entry is
        ``None`` (SGLang computes logits from that position on, so the first token has none). Raw model
        log-probs (temperature 1): what the trainer's trust check compares. With ``top_logprobs_num`` the
        most likely tokens at each position too (``input_top_logprobs``: ``[logprob, token_id, None]``
        entries, ``None`` for the first)."""
        if not self._ready:
            raise RuntimeError("EmbeddedEngine.start() must be awaited before generate()")
        prompt = await self._prompt(payload)
        self._check_adapter(payload)
        start = payload.get("logprob_start_len")
        params = SamplingParams.from_request(payload.get("sampling_params"))
        if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start < len(prompt):
            raise EngineRequestError(
                f"logprob_start_len must be an index into the {len(prompt)} prompt tokens, got {start!r}"
            )
        if params.max_new_tokens != 0 or payload.get("return_logprob") is not True:
            raise EngineRequestError(
                "the embedded engine returns prompt log-probs (logprob_start_len) only "
                "with return_logprob true and max_new_tokens 0"
            )

        top_k = payload.get("top_logprobs_num") or 0
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 0 <= top_k <= MAX_TOP_LOGPROBS:
            raise EngineRequestError(
                f"top_logprobs_num must be an integer in [0, {MAX_TOP_LOGPROBS}], got {top_k!r}"
            )

        def forward() -> tuple[list[float | None], list[Any]]:
            with torch.inference_mode(), self._kernels():
                ids = torch.tensor([prompt], device=self._batch.device)
                logits = self.model(input_ids=ids, use_cache=False).logits[0, :-1].float()
                log_probs = torch.log_softmax(logits, -1)
                picked = log_probs.gather(-1, ids[0, 1:, None])[:, 0]
                top: list[Any] = []
                if top_k:
                    values, indices = log_probs.topk(top_k, dim=-1)
                    top = [
                        [[lp, token, None] for lp, token in zip(row_values, row_indices, strict=True)]
                        for row_values, row_indices in zip(values.tolist(), indices.tolist(), strict=True)
                    ]
            return [None, *picked.tolist()[start:]], [None, *top[start:]]

        logprobs, top = await self._on_thread(forward)
        response = generate_response(
            rid=payload.get("rid") or new_rid(),
            text="",
            output_ids=[],
            prompt_tokens=len(prompt),
            finish_reason=finish_length(0),
            weight_version=self.weight_version,
            logprobs=[],
        )
        response["meta_info"]["input_token_logprobs"] = [
            [lp, tok, None] for lp, tok in zip(logprobs, prompt[start:], strict=True)
        ]
        if top_k:
            response["meta_info"]["input_top_logprobs"] = top
        return response

    async def generate_stream(self, payload: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        request = self._admit(payload, await self._prompt(payload), stream=True)
        assert request.stream is not None
        try:
            while True:
                chunk = await request.stream.get()
                if isinstance(chunk, EngineError):
                    raise chunk
                yield chunk
                if chunk["meta_info"]["finish_reason"] is not None:
                    return
        finally:
            if not request.done.done():  # the consumer went away
                await self.abort(request.rid)

    def _admit(self, payload: dict[str, Any], prompt: list[int], stream: bool = False) -> _Request:
        """Check one request whose prompt :meth:`_prompt` gave, and queue it; malformed requests raise
        EngineRequestError."""
        params = SamplingParams.from_request(payload.get("sampling_params"), self.model.config.vocab_size)
        for flag in ("return_logprob", "return_text_in_logprobs", "stream"):
            if not isinstance(payload.get(flag, False), bool):
                raise EngineRequestError(f"{flag} must be true or false, got {payload[flag]!r}")
        if payload.get("image_data"):
            assert self.model_path is not None  # found before the engine was ready
            raise EngineRequestError(
                f"the model {self.model_path.name} cannot take images (it has no image "
                f"understanding): image_data is not supported; use a vision-language model"
            )
        if payload.get("top_logprobs_num"):
            raise EngineRequestError("top_logprobs_num is not supported by the embedded engine")
        self._check_adapter(payload)
        rid = payload.get("rid") or new_rid()
        if not isinstance(rid, str):
            raise EngineRequestError(f"rid must be a string, got {rid!r}")
        loop = asyncio.get_running_loop()
        request = _Request(
            rid=rid,
            prompt=prompt,
            params=params,
            return_logprob=bool(payload.get("return_logprob")),
            text_in_logprobs=bool(payload.get("return_text_in_logprobs")),
            done=loop.create_future(),
            stream=asyncio.Queue() if stream else None,
        )
        if params.sampling_seed is not None and not params.greedy:
            request.generator = torch.Generator(device=self._batch.device).manual_seed(params.sampling_seed)
        with self._work:
            if params.max_new_tokens == 0:
                out = [self._finish(request, finish_length(0))]
            else:
                out = []
                self._waiting.append(request)
                self._work.notify()
        self._deliver(out)
        return request

    async def _prompt(self, payload: Any) -> list[int]:
        """The request's prompt as token ids. Sizes are checked before any work; a long text is tokenized
        in a worker thread, so one request cannot freeze the event loop the others share."""
        if not self._ready:
            raise RuntimeError("EmbeddedEngine.start() must be awaited before generate()")
        if not isinstance(payload, dict):
            raise EngineRequestError(f"request body must be a JSON object, got {type(payload).__name__}")
        ids, text = payload.get("input_ids"), payload.get("text")
        if ids is None and text is None:
            raise EngineRequestError("either input_ids or text is required")
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if ids is not None:
            if not isinstance(ids, list):
                raise EngineRequestError(f"input_ids must be list or null; got {type(ids).__name__}")
            self._check_prompt_length(len(ids), limit)
            vocab = self.model.config.vocab_size
            if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids):
                raise EngineRequestError(f"input_ids must be token ids in [0, {vocab})")
        else:
            if not isinstance(text, str):
                raise EngineRequestError(
                    f"text must be a string or a list of strings; got {type(text).__name__}"
                )
            if limit and len(text) > limit * MAX_CHARS_PER_TOKEN:
                raise EngineRequestError(
                    f"text has {len(text)} characters, more than the model's context of "
                    f"{limit} tokens can hold (at most {MAX_CHARS_PER_TOKEN} characters a token)"
                )
            if len(text) <= INLINE_TOKENIZE_CHARS:
                ids = self.tokenizer(text)["input_ids"]
            else:
                ids = (await asyncio.to_thread(self.tokenizer, text))["input_ids"]
        if not ids:
            raise EngineRequestError("the prompt is empty")
        self._check_prompt_length(len(ids), limit)
        return ids

    @staticmethod
    def _check_prompt_length(length: int, limit: int | None) -> None:
        if limit and length >= limit:
            raise EngineRequestError(f"the prompt has {length} tokens; the model's context is {limit}")

    async def abort(self, rid: str | None = None) -> None:
        with self._work:
            kept: deque[_Request] = deque()
            out = []
            for request in self._waiting:
                if rid is None or request.rid == rid:
                    out.append(self._finish(request, finish_abort()))
                else:
                    kept.append(request)
            self._waiting = kept
            for request in (*self._joining, *self._rows):
                if not request.finished and (rid is None or request.rid == rid):
                    out.append(self._finish(request, finish_abort()))
            self._work.notify()  # a paused engine frees the aborted rows' cache
        self._deliver(out)

    async def nondeterminism(self) -> str | None:
        """A request's output depends on its body alone when it runs by itself (``max_batch_size`` 1, as in
        ``--deterministic``); in a batch formed as requests arrive, its log-probs differ in the last bits
        with the rows it shared the batch with."""
        if self.max_batch_size == 1:
            return None
        return (
            f"the embedded engine decodes up to {self.max_batch_size} requests in one batch, formed as they "
            "arrive: a request's log-probs (and, rarely, its tokens) differ in the last bits with the rows it "
            "shared the batch with (--deterministic runs one request at a time)"
        )

    async def tokenizer_info(self) -> dict[str, Any] | None:
        return tokenizer_fingerprint(self.tokenizer)

    async def load(self) -> dict[str, int]:
        with self._lock:
            running = sum(not r.finished for r in (*self._joining, *self._rows))
            return {"num_running_reqs": running, "num_waiting_reqs": len(self._waiting)}

    # ---------------------------------------------------------------- control

    async def model_info(self) -> dict[str, Any]:
        config = self.model.config
        return {
            "model_path": str(self.model_path),
            "tokenizer_path": str(self.model_path),
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": config.model_type,
            "architectures": list(config.architectures or [type(self.model).__name__]),
        }

    async def pause(self, mode: str = "abort") -> None:
        with self._lock:
            self._paused = True
        if mode == "abort":
            await self.abort()
        await self._on_thread(lambda: None)  # the step in progress has finished

    async def resume(self) -> None:
        with self._work:
            self._paused = False
            self._work.notify()

    async def flush_cache(self) -> bool:
        load = await self.load()
        return load["num_running_reqs"] + load["num_waiting_reqs"] == 0

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> None:
        """Load the weights of the Hugging Face folder ``model_path`` between two steps."""
        from transformers import AutoModelForCausalLM

        path = Path(model_path).expanduser()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{model_path!r} is not a Hugging Face model folder (no config.json)")
        new = await asyncio.to_thread(
            AutoModelForCausalLM.from_pretrained, path, dtype=getattr(torch, self.dtype)
        )
        await self.update_weights(new.state_dict(), weight_version)

    async def update_weights(
        self, state_dict: Mapping[str, torch.Tensor], weight_version: str | None = None
    ) -> None:
        """Copy an in-process state dict into the model between two steps; ``weight_version`` defaults
        to a count of updates. Missing or unexpected keys (other than tied aliases) raise ValueError."""
        await self._on_thread(self._copy_weights, state_dict)
        self._updates += 1
        self.weight_version = weight_version if weight_version is not None else str(self._updates)

    async def weight_checksums(self) -> list[ServedChecksums]:
        """The checksum of every weight under its Hugging Face name, taken on the engine thread between two
        steps (a merged LoRA adapter included: it is in the weights)."""

        def checksums() -> dict[str, str]:
            with torch.inference_mode():
                return {name: tensor_checksum(t) for name, t in self.model.state_dict().items()}

        return [ServedChecksums("the embedded engine", await self._on_thread(checksums))]

    def _check_adapter(self, payload: dict[str, Any]) -> None:
        """A request's ``lora_path`` must name the adapter the engine serves (it merges one at a time)."""
        name = payload.get("lora_path")
        if name is not None and name != self.lora_name:
            served = f"it serves {self.lora_name!r}" if self.lora_name else "it serves no adapter"
            raise EngineRequestError(
                f"lora_path {str(name)[:100]!r} is not the embedded engine's adapter ({served}; it merges the "
                "adapter loaded last into its weights and serves every request with it)"
            )

    async def load_lora_adapter(self, lora_name: str, lora_path: str) -> None:
        """Load a PEFT adapter folder and merge it into the weights (in place of the adapter before)."""
        config, tensors = await asyncio.to_thread(read_lora_adapter, Path(lora_path))
        await self._load_adapter(lora_name, config, tensors, lora_path)

    async def load_lora_adapter_tensors(
        self, lora_name: str, config: dict[str, Any], tensors: Mapping[str, Any]
    ) -> None:
        await self._load_adapter(lora_name, config, tensors, "<tensors>")

    async def _load_adapter(
        self, lora_name: str, config: dict[str, Any], tensors: Mapping[str, Any], source: str
    ) -> None:
        if lora_name in self.lora_adapters:
            raise EngineRequestError(f"a LoRA adapter named {lora_name!r} is already loaded")
        state = self.model.state_dict()
        deltas = lora_adapter_deltas(config, tensors, state)
        shared = Counter(t.data_ptr() for t in state.values())
        if tied := [name for name in deltas if shared[state[name].data_ptr()] > 1]:
            await self._on_thread(self._untie, tied)
        await self._on_thread(self._merge_adapter, deltas)
        self._lora_deltas[lora_name] = deltas
        self.lora_adapters[lora_name] = source
        self.lora_name = lora_name

    async def unload_lora_adapter(self, lora_name: str) -> None:
        """Forget an adapter; the one served gives the weights back their values without it."""
        if lora_name not in self.lora_adapters:
            raise EngineRequestError(f"no LoRA adapter named {lora_name!r} is loaded")
        if lora_name == self.lora_name:
            await self._on_thread(self._merge_adapter, {})
            self.lora_name = None
        del self.lora_adapters[lora_name], self._lora_deltas[lora_name]

    async def update_weight_version(self, version: str) -> None:
        self.weight_version = version

    def _untie(self, names: list[str]) -> None:
        """Give each weight of ``names`` storage of its own, so that an adapter merged into it leaves the
        weight it was tied to as it is (the output head of a model with tied embeddings: the embeddings)."""
        for name in names:
            owner, _, attribute = name.rpartition(".")
            module = self.model.get_submodule(owner)
            untied = torch.nn.Parameter(getattr(module, attribute).detach().clone(), requires_grad=False)
            setattr(module, attribute, untied)
        self.model.config.tie_word_embeddings = False
        self._batch.settle()  # static decode steps read the storage the weight had

    def _merge_adapter(self, deltas: Mapping[str, torch.Tensor]) -> None:
        """The weights without the adapter before, plus ``deltas``."""
        current = self.model.state_dict()
        with torch.inference_mode():
            for name, base in self._lora_base.items():
                current[name].copy_(base)
            for name, delta in deltas.items():
                if name not in self._lora_base:
                    self._lora_base[name] = current[name].clone()
                current[name].add_(delta.to(current[name].device, current[name].dtype))

    def _copy_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        current = self.model.state_dict()
        unexpected = sorted(set(state_dict) - set(current))
        owners: dict[int, str] = {}
        for name, tensor in current.items():
            owners.setdefault(tensor.data_ptr(), name)
        given = {owners[current[name].data_ptr()] for name in state_dict if name in current}
        missing = sorted(name for name, t in current.items() if owners[t.data_ptr()] not in given)
        if unexpected or missing:
            raise ValueError(
                f"state dict does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        self._lora_base.clear()  # new base weights: an adapter merged before is gone with the old ones
        self.lora_adapters.clear()
        self._lora_deltas.clear()
        self.lora_name = None
        with torch.inference_mode():
            for name, tensor in state_dict.items():
                current[name].copy_(tensor)

    # ---------------------------------------------------------------- the engine thread

    def _run(self) -> None:
        """The engine thread: jobs first, then prefill waiting requests or decode the running rows;
        finished responses go to the event loop once per step. Ends when the engine closes."""
        while True:
            with self._work:
                self._work.wait_for(self._has_work)
                if self._jobs:
                    job, future = self._jobs.popleft()
                elif self._closing:
                    return
                else:
                    job = None
                    self._joining = [] if self._paused else self._take_waiting()
                    joining = self._joining
                    idle = not joining and (self._paused or all(r.finished for r in self._rows))
            if job is not None:
                self._deliver_soon(self._collect())
                settle_future(job, future)
            elif idle:
                self._deliver_soon(self._collect())
                self._shrink()  # free finished rows' cache
            else:
                self._deliver_soon(self._step(joining))

    def _has_work(self) -> bool:
        """Under the lock: whether the engine thread has something to do."""
        if (
            self._jobs
            or self._closing
            or self._launched
            or (not self._paused and (self._waiting or self._rows))
        ):
            return True
        return any(r.finished for r in self._rows)  # a paused engine frees finished rows' cache

    def _take_waiting(self) -> list[_Request]:
        """Under the lock: waiting requests that fit the batch (rows, and the prefill-token budget counted
        over distinct prompts: the prefill runs each once)."""
        if not self._waiting:
            return []
        live = sum(not r.finished for r in self._rows)
        room = self.max_batch_size - live
        if room <= 0 or (live and not self._batch.mergeable):
            return []
        joining: list[_Request] = []
        distinct: set[tuple[int, ...]] = set()
        longest = 0
        while self._waiting and len(joining) < room:
            prompt = tuple(self._waiting[0].prompt)
            if prompt not in distinct:
                longest = max(longest, len(prompt))
                if joining and longest * (len(distinct) + 1) > self.max_prefill_tokens:
                    break
                distinct.add(prompt)
            joining.append(self._waiting.popleft())
        return joining

    def _step(self, joining: list[_Request]) -> list[tuple[_Request, dict[str, Any] | EngineError]]:
        """Drop finished rows, then prefill ``joining`` or decode every row, and record each row's new
        token (with static decode, a decode step's tokens are recorded after the next step is launched).
        Returns what goes to the event loop: finished responses, stream chunks, errors."""
        started = time.perf_counter()
        overlap = (
            self._batch.static_decode and not joining and not any(r.params.reads_output for r in self._rows)
        )
        out: list[tuple[_Request, dict[str, Any] | EngineError]] = []
        try:
            if not overlap:
                out += self._collect()
            with torch.inference_mode(), self._kernels():
                self._shrink(force=bool(joining))
                if joining:
                    first = self._batch.size
                    logits = self._batch.prefill([r.prompt for r in joining])
                    sampler = self._make_sampler(joining)
                    self._sampler = None
                    rows = joining
                else:
                    first = 0
                    logits = self._batch.decode()
                    if self._sampler is None:
                        self._sampler = self._make_sampler(self._rows)
                    sampler, rows = self._sampler, list(self._rows)
                # penalties read each row's output so far (a decode step never overlaps the next then)
                outputs = [r.output for r in rows] if sampler.reads_output else None
                tokens, logprobs = sampler.sample(logits, outputs)
                self._batch.set_tokens(tokens, first)
                if overlap:
                    launched = _Launched(
                        rows, tokens.to("cpu", non_blocking=True), logprobs.to("cpu", non_blocking=True), None
                    )
                    if tokens.is_cuda:
                        launched.done = torch.cuda.Event()
                        launched.done.record()
                    out += self._collect()  # the previous step's tokens, while this one runs
                    self._launched = launched
                else:
                    out += self._record(rows, tokens.tolist(), logprobs.tolist(), joining=bool(joining))
        except Exception as exc:  # fail the batch's requests, keep serving new ones
            error = EngineError(f"the embedded engine failed on a step: {type(exc).__name__}: {exc}")
            with self._lock:
                failed = [r for r in (*self._rows, *joining) if not r.finished]
                for request in failed:
                    request.finished = True
                self._rows, self._joining = [], []
            self._launched = None
            with torch.inference_mode():
                self._batch.keep([])
            self._sampler = None
            return out + [(request, error) for request in failed]
        self.stats.busy_seconds += time.perf_counter() - started
        self.stats.steps += 1
        self.stats.prefills += bool(joining)
        return out

    def _collect(self) -> list[tuple[_Request, dict[str, Any] | EngineError]]:
        """Wait for the launched decode step's tokens, if any, and record them."""
        launched, self._launched = self._launched, None
        if launched is None:
            return []
        if launched.done is not None:
            launched.done.synchronize()
        return self._record(
            launched.rows, launched.tokens.tolist(), launched.logprobs.tolist(), joining=False
        )

    def _record(
        self, rows: list[_Request], tokens: list[int], logprobs: list[float], joining: bool
    ) -> list[tuple[_Request, dict[str, Any] | EngineError]]:
        """Give each row its new token (``joining``: the rows just prefilled join the batch)."""
        out: list[tuple[_Request, dict[str, Any] | EngineError]] = []
        with self._lock:
            if joining:
                self._rows.extend(rows)
                self._joining = []
            self.stats.max_batch = max(self.stats.max_batch, len(self._rows))
            for row, token, logprob in zip(rows, tokens, logprobs):
                if not row.finished:  # finished in an earlier step (static decode) or aborted since
                    self._advance(row, token, logprob, out)
                    self.stats.tokens += 1
        return out

    def _shrink(self, force: bool = True) -> None:
        """Remove finished rows from the batch; with static decode and unless ``force``, only once a
        quarter of the rows have finished."""
        with self._lock:
            keep = [i for i, r in enumerate(self._rows) if not r.finished]
            finished = len(self._rows) - len(keep)
            if not finished or (
                not force and self._batch.static_decode and keep and finished * 4 < len(self._rows)
            ):
                return
            rows = [self._rows[i] for i in keep]
        with torch.inference_mode():
            self._batch.keep(keep)
        with self._lock:  # only this thread changes the rows; the loop may have finished more meanwhile
            self._rows = rows
        self._sampler = None

    def _make_sampler(self, rows: list[_Request]) -> BatchSampler:
        return BatchSampler(
            [r.params for r in rows],
            [r.generator for r in rows],
            self._shared_generator,
            self._batch.device,
            self._eos,
        )

    def _deliver_soon(self, out: list[tuple[_Request, dict[str, Any] | EngineError]]) -> None:
        """From the engine thread: hand ``out`` to the event loop."""
        if out:
            assert self._loop is not None  # set by start() before the thread runs
            try:
                self._loop.call_soon_threadsafe(self._deliver, out)
            except RuntimeError:  # the event loop is closed: nobody is waiting any more
                pass

    @staticmethod
    def _deliver(out: Sequence[tuple[_Request, dict[str, Any] | EngineError]]) -> None:
        """On the event loop: stream chunks and errors to streams, final responses and errors to ``done``."""
        for request, item in out:
            if request.stream is not None:
                request.stream.put_nowait(item)
            if request.done.done():
                continue
            if isinstance(item, EngineError):
                request.done.set_exception(item)
            elif item["meta_info"]["finish_reason"] is not None:
                request.done.set_result(item)

    # ---------------------------------------------------------------- responses (under the lock)

    def _advance(
        self,
        request: _Request,
        token: int,
        logprob: float,
        out: list[tuple[_Request, dict[str, Any] | EngineError]],
    ) -> None:
        """Record one new token; finish the request when it stops. What the loop must hand out goes to ``out``."""
        request.output.append(token)
        request.logprobs.append(logprob)
        params = request.params
        finish = None
        matched = self._stop_string(request) if params.stop else None
        if token in params.stop_token_ids or (token in self._eos and not params.ignore_eos):
            finish = finish_stop(token)
        elif matched is not None:
            finish = finish_stop(matched)
        elif len(request.output) >= params.max_new_tokens:
            finish = finish_length(params.max_new_tokens)
        elif len(request.prompt) + len(request.output) >= self.model.config.max_position_embeddings:
            finish = finish_length(len(request.output))
        if finish is not None:
            out.append(self._finish(request, finish))
        elif request.stream is not None:
            out.append((request, self._response(request, None)))

    def _stop_string(self, request: _Request) -> str | None:
        """The stop string that appears first in the newest text, if any."""
        window = max(len(s) for s in request.params.stop) + _STOP_WINDOW
        tail = self._decode(request.output[-window:], request.params)
        hits = [s for s in request.params.stop if s in tail]
        if not hits:
            return None
        text = self._decode(request.output, request.params)
        return min(hits, key=lambda s: (text.find(s) if s in text else len(text)))

    def _decode(self, ids: list[int], params: SamplingParams) -> str:
        return self._detokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)

    def _text(self, request: _Request, finish: dict[str, Any] | None) -> str:
        params = request.params
        ids = request.output
        if (
            finish is not None
            and finish["type"] == "stop"
            and isinstance(finish["matched"], int)
            and not params.no_stop_trim
        ):
            ids = ids[:-1]  # a matched stop token stays in output_ids, not in text
        text = self._decode(ids, params)
        if (
            finish is None
        ):  # a stream chunk holds back a character whose bytes have not all come, as SGLang's does
            return text.rstrip("\ufffd")
        if finish["type"] == "stop" and isinstance(finish["matched"], str) and not params.no_stop_trim:
            text = text[: text.find(finish["matched"])]
        return text

    def _response(self, request: _Request, finish: dict[str, Any] | None) -> dict[str, Any]:
        token_texts = None
        if request.return_logprob and request.text_in_logprobs:
            token_texts = [self._detokenizer.decode([t]) for t in request.output]
        return generate_response(
            rid=request.rid,
            text=self._text(request, finish),
            output_ids=request.output,
            prompt_tokens=len(request.prompt),
            finish_reason=finish,
            weight_version=self.weight_version,
            logprobs=list(request.logprobs) if request.return_logprob else None,
            token_texts=token_texts,
            started=request.started if finish is not None else None,
            sent_ts=finish is not None or len(request.output) == 1,
        )

    def _finish(self, request: _Request, finish: dict[str, Any]) -> tuple[_Request, dict[str, Any]]:
        request.finished = True
        return request, self._response(request, finish)
