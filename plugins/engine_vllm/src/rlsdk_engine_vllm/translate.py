"""SGLang's ``/generate`` (rlsdk's engine protocol) as vLLM 0.26's ``/v1/completions``, and back.

A ``/generate`` body becomes one completion request for prompt token ids (or a text prompt) with
``return_token_ids`` and, where log-probs are asked for, ``logprobs: 0`` (the sampled token's own log-prob;
``top_logprobs_num`` asks for more and reads the tokens as ids). Prompt log-probs (``logprob_start_len``,
the trust check's probe) come from ``prompt_logprobs: 0``: vLLM gives one per prompt token but the first,
as ``{token_id: {"logprob", "rank", "decoded_token"}}``. ``max_new_tokens: 0`` (score only) asks vLLM for
one token, which the answer leaves out. Every sampling parameter is translated or refused by name: nothing
is dropped silently. The answer is rebuilt in SGLang 0.5.17's shapes (:func:`rlsdk.generate_response`):
vLLM ends a request with ``stop`` (``stop_reason``: the stop string, the stop token id, or ``None`` for
EOS, whose id is the last output token), ``length`` or ``abort``.

vLLM names a completion request ``cmpl-<request_id>-<prompt index>``; :func:`vllm_request_id` is the name
``/abort_requests`` takes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from rlsdk.engine_api import (
    EngineRequestError,
    EngineResponseError,
    finish_abort,
    finish_length,
    finish_stop,
    generate_response,
)

SAMPLING = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "spaces_between_special_tokens": "spaces_between_special_tokens",
    "no_stop_trim": "include_stop_str_in_output",
    "sampling_seed": "seed",
    "logit_bias": "logit_bias",
}
"""SGLang's sampling parameters -> vLLM's completion fields of the same meaning."""

STRUCTURED = {"json_schema": "json", "regex": "regex", "ebnf": "grammar"}
"""SGLang's constrained-decoding parameters -> vLLM's ``structured_outputs`` keys."""

DEFAULT_MAX_NEW_TOKENS = 128
"""SGLang's default for a request that names none (vLLM's completions would stop at 16)."""

REQUEST_KEYS = {
    "input_ids",
    "text",
    "sampling_params",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "rid",
    "stream",
    "lora_path",
}
"""The ``/generate`` keys this engine understands; any other is refused by name."""


def vllm_request_id(rid: str) -> str:
    """The id vLLM 0.26 gives the one prompt of completion request ``rid`` (what ``/abort_requests`` takes)."""
    return f"cmpl-{rid}-0"


@dataclass
class Completion:
    """One ``/generate`` item as a completion request, and what reading its answer needs."""

    body: dict[str, Any]
    rid: str
    prompt_tokens: int | None
    logprobs: bool
    top_logprobs: int
    logprob_start: int | None
    token_texts: bool
    score_only: bool
    started: float = field(default_factory=time.perf_counter)


def completion_request(
    payload: dict[str, Any], rid: str, model: str | None, stream: bool = False
) -> Completion:
    """The ``/v1/completions`` body of one (not batched) ``/generate`` body; ``model`` names the LoRA
    adapter to serve it with (None: the base model). :class:`rlsdk.EngineRequestError` for what vLLM
    cannot do."""
    unknown = sorted(set(payload) - REQUEST_KEYS)
    if unknown:
        raise EngineRequestError(
            f"vllm engine: /generate key {unknown[0]!r} has no vLLM 0.26 equivalent (it takes "
            f"{', '.join(sorted(REQUEST_KEYS))})"
        )
    ids, text = payload.get("input_ids"), payload.get("text")
    if isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        prompt: Any = ids
    elif ids is None and isinstance(text, str) and text:
        prompt = text
    else:
        raise EngineRequestError("vllm engine: /generate needs input_ids (token ids) or text (a string)")
    params = payload.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise EngineRequestError(f"sampling_params must be an object, got {type(params).__name__}")
    body: dict[str, Any] = {"prompt": prompt, "request_id": rid, "return_token_ids": True}
    if model is not None:
        body["model"] = model
    structured: dict[str, Any] = {}
    for key, value in params.items():
        if key in SAMPLING:
            body[SAMPLING[key]] = value
        elif key in STRUCTURED:
            structured[STRUCTURED[key]] = json.loads(value) if key == "json_schema" else value
        elif key == "n" and value == 1:
            continue
        else:
            raise EngineRequestError(
                f"vllm engine: sampling parameter {key!r} has no vLLM 0.26 equivalent here"
                + (" (n > 1: send one request per sample)" if key == "n" else "")
            )
    if structured:
        body["structured_outputs"] = structured
    max_new = body.get("max_tokens", DEFAULT_MAX_NEW_TOKENS)
    if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 0:
        raise EngineRequestError(f"max_new_tokens must be a non-negative integer, got {max_new!r}")
    score_only = max_new == 0
    body["max_tokens"] = max(max_new, 1)  # vLLM generates at least one token: a score-only answer drops it
    logprobs = bool(payload.get("return_logprob", False))
    top = int(payload.get("top_logprobs_num") or 0) if logprobs else 0
    if logprobs:
        body["logprobs"] = top
        if top:
            body["return_tokens_as_token_ids"] = True  # top log-probs keyed by token id, not text
    start = payload.get("logprob_start_len")
    if start in (None, -1) or not logprobs:
        start = None
    else:
        if not isinstance(prompt, list) or not isinstance(start, int) or not 0 <= start < len(prompt):
            raise EngineRequestError(
                f"logprob_start_len must be an index into the prompt's token ids (input_ids), got {start!r}"
            )
        if stream:
            raise EngineRequestError("vllm engine: prompt log-probs (logprob_start_len) cannot be streamed")
        body["prompt_logprobs"] = 0
    if stream:
        body["stream"] = True
    return Completion(
        body=body,
        rid=rid,
        prompt_tokens=len(prompt) if isinstance(prompt, list) else None,
        logprobs=logprobs,
        top_logprobs=top,
        logprob_start=start,
        token_texts=bool(payload.get("return_text_in_logprobs", False)) and not top,
        score_only=score_only,
    )


def finish_reason(reason: Any, stop_reason: Any, output_ids: list[int], source: str) -> dict[str, Any] | None:
    """SGLang's ``finish_reason`` object for vLLM's ``finish_reason`` and ``stop_reason``."""
    if reason is None:
        return None
    if reason == "stop":
        if stop_reason is None:  # EOS: its id is the last output token
            return finish_stop(output_ids[-1] if output_ids else None)
        return finish_stop(stop_reason)
    if reason == "length":
        return finish_length(len(output_ids))
    if reason == "abort":
        return finish_abort()
    raise EngineResponseError(f"{source}: a finish_reason SGLang's protocol has no word for: {reason!r}")


@dataclass
class Accumulated:
    """What a request produced so far, from vLLM's choice deltas (a stream) or its one choice."""

    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_texts: list[str] = field(default_factory=list)
    top: list[list[list[Any]]] = field(default_factory=list)
    prompt_tokens: int | None = None
    finish: dict[str, Any] | None = None

    def add(self, choice: dict[str, Any], request: Completion, source: str) -> None:
        """Append one choice (a stream's delta, or the whole answer's)."""
        ids = choice.get("token_ids")
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise EngineResponseError(
                f"{source}: a choice without token_ids (return_token_ids): {choice!r:.200}"
            )
        self.text += str(choice.get("text") or "")
        self.output_ids += ids
        if request.logprobs:
            self._add_logprobs(choice.get("logprobs"), len(ids), request.top_logprobs > 0, source)
        prompt_ids = choice.get("prompt_token_ids")
        if isinstance(prompt_ids, list):
            self.prompt_tokens = len(prompt_ids)
        self.finish = finish_reason(
            choice.get("finish_reason"), choice.get("stop_reason"), self.output_ids, source
        )

    def _add_logprobs(self, logprobs: Any, count: int, top: bool, source: str) -> None:
        values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
        tokens = logprobs.get("tokens") if isinstance(logprobs, dict) else None
        if not isinstance(values, list) or len(values) != count or not isinstance(tokens, list):
            raise EngineResponseError(
                f"{source}: {count} tokens with log-probs {logprobs!r:.200} (expected token_logprobs and tokens "
                "of one entry each)"
            )
        self.logprobs += [float(v) for v in values]
        self.token_texts += [str(t) for t in tokens]
        for entry in logprobs.get("top_logprobs") or [] if top else []:  # keyed "token_id:<id>"
            self.top.append(
                [
                    [float(lp), int(str(tok).removeprefix("token_id:")), None]
                    for tok, lp in (entry or {}).items()
                ]
            )


def sglang_response(
    done: Accumulated, request: Completion, weight_version: str, prompt_logprobs: Any = None
) -> dict[str, Any]:
    """SGLang's ``/generate`` answer for what a completion request produced (cumulative for a stream)."""
    output_ids, logprobs, texts = done.output_ids, done.logprobs, done.token_texts
    finish = done.finish
    if request.score_only:  # vLLM generated one token to score the prompt: SGLang's answer has none
        output_ids, logprobs, texts = [], [], []
        finish = finish_length(0) if finish is not None else None
    response = generate_response(
        rid=request.rid,
        text="" if request.score_only else done.text,
        output_ids=output_ids,
        prompt_tokens=done.prompt_tokens or request.prompt_tokens or 0,
        finish_reason=finish,
        weight_version=weight_version,
        logprobs=logprobs if request.logprobs else None,
        token_texts=texts if request.token_texts else None,
        started=request.started if finish is not None else None,
    )
    if request.top_logprobs:
        response["meta_info"]["output_top_logprobs"] = [] if request.score_only else done.top
    if request.logprob_start is not None:
        response["meta_info"]["input_token_logprobs"] = input_logprobs(
            prompt_logprobs, request.body["prompt"], request.logprob_start
        )
    return response


def input_logprobs(prompt_logprobs: Any, prompt: list[int], start: int) -> list[list[Any]]:
    """SGLang's ``input_token_logprobs`` from ``start`` on, from vLLM's ``prompt_logprobs`` (one entry per
    prompt token, ``None`` for the first, each ``{token_id: {"logprob": ...}}`` with the prompt's own token
    among its keys). As SGLang, the range's first entry has no log-prob."""
    if not isinstance(prompt_logprobs, list) or len(prompt_logprobs) != len(prompt):
        raise EngineResponseError(
            f"prompt_logprobs for {len(prompt)} prompt tokens: {prompt_logprobs!r:.200} (expected one entry per "
            "token, the first null)"
        )
    out: list[list[Any]] = []
    for position in range(start, len(prompt)):
        token = prompt[position]
        entry = prompt_logprobs[position]
        if position == start:
            out.append([None, token, None])
            continue
        try:
            out.append([float(entry[str(token)]["logprob"]), token, None])
        except (TypeError, KeyError, ValueError):
            raise EngineResponseError(
                f"prompt_logprobs[{position}] lacks the prompt's token {token}: {entry!r:.200}"
            ) from None
    return out
