"""SGLang sampling parameters, checked, and batched sampling that reports the log-probability of each
token under the distribution it was actually drawn from."""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import torch

from rlsdk.engine_api import EngineRequestError

GREEDY_TEMPERATURE = 1e-6
"""At or below this temperature (or with ``top_k == 1``) decoding is greedy, as in SGLang."""

MAX_STOPS = 64
MAX_STOP_CHARS = 1024
"""Limits on ``stop`` strings, which are searched after every token for every row of the batch."""

# SGLang parameters the embedded engine accepts only at their no-op value.
_UNSUPPORTED_DEFAULTS: dict[str, Any] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "n": 1,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "stop_regex": None,
    "logit_bias": None,
    "custom_params": None,
}
_IGNORED = {"spaces_between_special_tokens", "stream_interval"}


@dataclass
class SamplingParams:
    """The ``sampling_params`` of one ``/generate`` request, with SGLang's defaults."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: set[int] = field(default_factory=set)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None
    repetition_penalty: float = 1.0
    """Logits of tokens the response already holds are divided by it (multiplied where negative), as SGLang's
    repetition penalizer does (the prompt's tokens are not counted)."""
    min_new_tokens: int = 0
    """Until the response has this many tokens, its stop tokens (``stop_token_ids`` and EOS) cannot be
    sampled, as SGLang's min-new-tokens penalizer does (stop strings still stop)."""

    @property
    def greedy(self) -> bool:
        return self.temperature <= GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def reads_output(self) -> bool:
        """Whether sampling the next token depends on the tokens the response already holds."""
        return self.repetition_penalty != 1.0 or self.min_new_tokens > 0

    @classmethod
    def from_request(cls, raw: Any, vocab_size: int | None = None) -> SamplingParams:
        """Check a request's ``sampling_params``; anything malformed raises :class:`EngineRequestError`.
        A ``top_k`` of ``vocab_size`` or more restricts nothing, so it becomes -1 (off)."""
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise EngineRequestError(f"sampling_params must be an object, got {type(raw).__name__}")
        params = cls()
        for key, value in raw.items():
            if key in _IGNORED or value is None:
                continue
            if key in _UNSUPPORTED_DEFAULTS:
                if value != _UNSUPPORTED_DEFAULTS[key]:
                    raise EngineRequestError(
                        f"sampling_params.{key}={value!r} is not supported by the embedded engine"
                    )
                continue
            if key not in _CHECKS:
                raise EngineRequestError(f"unknown sampling parameter {key!r}")
            setattr(params, key, _CHECKS[key](key, value))
        if params.temperature < 0:
            raise EngineRequestError(f"temperature must be >= 0, got {params.temperature}")
        if not 0 < params.top_p <= 1:
            raise EngineRequestError(f"top_p must be in (0, 1], got {params.top_p}")
        if params.top_k == 0 or params.top_k < -1:
            raise EngineRequestError(f"top_k must be -1 (off) or >= 1, got {params.top_k}")
        if not 0 <= params.min_p <= 1:
            raise EngineRequestError(f"min_p must be in [0, 1], got {params.min_p}")
        if params.max_new_tokens < 0:
            raise EngineRequestError(f"max_new_tokens must be >= 0, got {params.max_new_tokens}")
        if not 0 < params.repetition_penalty <= 2:
            raise EngineRequestError(f"repetition_penalty must be in (0, 2], got {params.repetition_penalty}")
        if not 0 <= params.min_new_tokens <= params.max_new_tokens:
            raise EngineRequestError(
                f"min_new_tokens must be in [0, max_new_tokens], got {params.min_new_tokens}"
            )
        if params.sampling_seed is not None and not 0 <= params.sampling_seed < 2**63:
            raise EngineRequestError(f"sampling_seed must be in [0, 2**63), got {params.sampling_seed}")
        if vocab_size is not None and params.top_k >= vocab_size:
            params.top_k = -1
        return params


def _int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise EngineRequestError(f"sampling_params.{key} must be an integer, got {value!r}")
    return value


def _float(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EngineRequestError(f"sampling_params.{key} must be a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise EngineRequestError(f"sampling_params.{key} must be a finite number, got {value!r:.40}")
    return number


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise EngineRequestError(f"sampling_params.{key} must be true or false, got {value!r}")
    return value


def _stop(key: str, value: Any) -> list[str]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise EngineRequestError(
            f"sampling_params.stop must be a string or a list of non-empty strings, got {value!r:.200}"
        )
    if len(stops) > MAX_STOPS or max(map(len, stops), default=0) > MAX_STOP_CHARS:
        # every stop string is looked for after every token, on the thread that decodes the whole batch
        raise EngineRequestError(
            f"sampling_params.stop takes at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters"
        )
    return stops


def _stop_ids(key: str, value: Any) -> set[int]:
    ids = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise EngineRequestError(f"sampling_params.stop_token_ids must be a list of integers, got {value!r}")
    return set(ids)


_CHECKS = {
    "max_new_tokens": _int,
    "temperature": _float,
    "top_p": _float,
    "top_k": _int,
    "min_p": _float,
    "stop": _stop,
    "stop_token_ids": _stop_ids,
    "ignore_eos": _bool,
    "skip_special_tokens": _bool,
    "no_stop_trim": _bool,
    "sampling_seed": _int,
    "repetition_penalty": _float,
    "min_new_tokens": _int,
}


class BatchSampler:
    """Sampling settings of the rows of a running batch as tensors, rebuilt when the rows change.

    Greedy rows take the argmax and report the model's own log-probability; sampled rows draw from
    softmax(logits / temperature) restricted by top-k, top-p and min-p and renormalized, and report the
    log-probability under that distribution. Each row's uniform number comes from its own generator
    when it has a ``sampling_seed``, so a seeded request gives the same tokens in any batch. Repetition
    penalties and ``min_new_tokens`` apply to the logits first; they need each row's output so far
    (:attr:`reads_output`).
    """

    def __init__(
        self,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        shared: torch.Generator,
        device: torch.device,
        eos: Collection[int] = (),
    ) -> None:
        self.generators = generators
        self.shared = shared
        self.device = device
        penalties = [p.repetition_penalty for p in params]
        self.repetition = (
            torch.tensor(penalties, device=device).unsqueeze(1) if any(x != 1.0 for x in penalties) else None
        )
        minimums = [p.min_new_tokens for p in params]
        self.min_new_tokens = torch.tensor(minimums, device=device).unsqueeze(1) if any(minimums) else None
        self.stops = [sorted(p.stop_token_ids | (set() if p.ignore_eos else set(eos))) for p in params]
        self.reads_output = self.repetition is not None or self.min_new_tokens is not None
        self.greedy = torch.tensor([p.greedy for p in params], device=device)
        self.all_greedy = bool(self.greedy.all())
        sampled = [not p.greedy for p in params]
        self.temperature = torch.tensor(
            [p.temperature if s else 1.0 for p, s in zip(params, sampled)], device=device
        ).unsqueeze(1)
        top_k = [p.top_k if s and p.top_k > 0 else 0 for p, s in zip(params, sampled)]
        self.top_k = torch.tensor(top_k, device=device) if any(top_k) else None
        top_p = [p.top_p if s else 1.0 for p, s in zip(params, sampled)]
        self.top_p = torch.tensor(top_p, device=device).unsqueeze(1) if min(top_p) < 1.0 else None
        min_p = [p.min_p if s else 0.0 for p, s in zip(params, sampled)]
        self.min_p = torch.tensor(min_p, device=device).unsqueeze(1) if max(min_p) > 0.0 else None

    def sample(
        self, logits: torch.Tensor, outputs: list[list[int]] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens ``(B,)`` and their log-probabilities ``(B,)`` from float32 logits ``(B, V)``; ``outputs``
        (each row's response tokens so far) is needed where :attr:`reads_output`."""
        if self.reads_output:
            if outputs is None:
                raise ValueError("repetition_penalty and min_new_tokens need the rows' outputs")
            logits = self._penalized(logits, outputs)
        if self.all_greedy:
            tokens = logits.argmax(-1)
            return tokens, torch.log_softmax(logits, -1).gather(1, tokens[:, None]).squeeze(1)
        scores = logits / self.temperature
        if self.top_k is not None:
            kth = scores.topk(int(self.top_k.max()), dim=-1).values.gather(
                1, (self.top_k - 1).clamp(min=0)[:, None]
            )
            scores = scores.masked_fill((scores < kth) & (self.top_k > 0)[:, None], float("-inf"))
        if self.top_p is not None:
            ordered, order = scores.sort(dim=-1, descending=True)
            probs = ordered.softmax(-1)
            drop = (probs.cumsum(-1) - probs) > self.top_p  # keep the smallest head reaching top_p
            scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        if self.min_p is not None:
            probs = scores.softmax(-1)
            scores = scores.masked_fill(
                probs < self.min_p * probs.max(-1, keepdim=True).values, float("-inf")
            )
        logprobs = torch.log_softmax(scores, -1)
        cdf = logprobs.exp().cumsum(-1)
        draw = self._uniforms(logits.device) * cdf[:, -1]
        sampled = (
            torch.searchsorted(cdf, draw[:, None], right=True).squeeze(1).clamp(max=logits.shape[-1] - 1)
        )
        tokens = torch.where(self.greedy, logits.argmax(-1), sampled)
        return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)

    def _penalized(self, logits: torch.Tensor, outputs: list[list[int]]) -> torch.Tensor:
        if self.repetition is not None:
            rows = [row for row, ids in enumerate(outputs) for _ in ids]
            ids = list(itertools.chain.from_iterable(outputs))
            seen = torch.zeros_like(logits, dtype=torch.bool)
            seen[torch.tensor(rows, dtype=torch.long), torch.tensor(ids, dtype=torch.long)] = True
            factor = torch.where(seen, self.repetition, 1.0)
            logits = torch.where(logits < 0, logits * factor, logits / factor)
        if self.min_new_tokens is not None:
            lengths = torch.tensor([len(ids) for ids in outputs], device=self.device).unsqueeze(1)
            early = (lengths < self.min_new_tokens).squeeze(1).tolist()
            rows = [row for row, stops in enumerate(self.stops) if early[row] for _ in stops]
            ids = [i for row, stops in enumerate(self.stops) if early[row] for i in stops]
            if rows:
                logits = logits.index_put(
                    (torch.tensor(rows, dtype=torch.long), torch.tensor(ids, dtype=torch.long)),
                    torch.tensor(float("-inf"), device=logits.device),
                )
        return logits

    def _uniforms(self, device: torch.device) -> torch.Tensor:
        u = torch.rand(len(self.generators), generator=self.shared, device=device)
        for row, generator in enumerate(self.generators):
            if generator is not None:
                u[row] = torch.rand(1, generator=generator, device=device)[0]
        return u
