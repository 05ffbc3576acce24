"""SGLang's native protocol as SGLang 0.5.17 speaks it: errors, finish reasons, response bodies.

Shared by every engine that answers ``/generate`` itself (the embedded engine) and by the HTTP server
in :mod:`rlsdk.serve`, so both follow the real server's shapes (captured in
``tests/fixtures/sglang-0.5.17.json``).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from .errors import RlsdkError

SERVE_TOKEN_ENV = "RLSDK_SERVE_TOKEN"
"""The bearer token ``rlsdk serve`` requires off loopback, and the engine client sends when it is set."""


class EngineError(RlsdkError):
    """An engine failed to answer a request."""


class EngineRequestError(EngineError, ValueError):
    """A malformed request: the HTTP server answers 400 with SGLang's error body."""


class EngineUnavailableError(EngineError, ConnectionError):
    """The engine could not be reached (after retries)."""


def error_body(message: str, code: int = 400) -> dict[str, Any]:
    """SGLang's JSON error body (``type`` is ``"Bad Request"`` for 400, the code as text otherwise)."""
    return {
        "object": "error",
        "message": message,
        "type": "Bad Request" if code == 400 else str(code),
        "param": None,
        "code": code,
    }


def finish_stop(matched: int | str | None) -> dict[str, Any]:
    """Stopped by a stop token id or EOS (``matched`` is the id) or a stop string (the string)."""
    return {"type": "stop", "matched": matched}


def finish_length(length: int) -> dict[str, Any]:
    return {"type": "length", "length": length}


def finish_abort(message: str = "Aborted") -> dict[str, Any]:
    return {"type": "abort", "message": message, "status_code": None, "err_type": None}


def new_rid() -> str:
    return uuid.uuid4().hex


def generate_response(
    *,
    rid: str,
    text: str,
    output_ids: list[int],
    prompt_tokens: int,
    finish_reason: dict[str, Any] | None,
    weight_version: str,
    logprobs: list[float] | None = None,
    token_texts: list[str] | None = None,
    started: float | None = None,
    sent_ts: bool = True,
) -> dict[str, Any]:
    """One ``/generate`` response in 0.5.17's key order. ``logprobs`` (one per output id) adds the
    log-prob fields, as ``return_logprob`` does; ``started`` (a ``time.perf_counter()``) adds
    ``e2e_latency``, which SGLang sends on finished responses; ``sent_ts`` adds
    ``response_sent_to_client_ts``, which SGLang's streams carry on the first and last chunk only."""
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish_reason,
        "prompt_tokens": prompt_tokens,
        "weight_version": weight_version,
        "num_retractions": 0,
    }
    if logprobs is not None:
        texts = token_texts if token_texts is not None else [None] * len(output_ids)
        meta["input_token_logprobs"] = []
        meta["output_token_logprobs"] = [[lp, tok, t] for lp, tok, t in zip(logprobs, output_ids, texts)]
        meta["output_token_logprobs_length"] = len(output_ids)
    meta["reasoning_tokens"] = 0
    meta["completion_tokens"] = len(output_ids)
    meta["cached_tokens"] = 0
    meta["cached_tokens_details"] = None
    meta["dp_rank"] = None
    if started is not None:
        meta["e2e_latency"] = time.perf_counter() - started
    if sent_ts:
        meta["response_sent_to_client_ts"] = time.time()
    return {"text": text, "output_ids": list(output_ids), "meta_info": meta}


def split_batch(payload: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Split a batch ``/generate`` body (``input_ids`` a list of lists, or ``text`` a list) into one
    body per item, spreading list-valued ``sampling_params`` and ``rid``; None for a single request."""
    ids, text = payload.get("input_ids"), payload.get("text")
    if isinstance(ids, list) and ids and all(isinstance(x, list) for x in ids):
        items: list[Any] = ids
        key = "input_ids"
    elif isinstance(text, list):
        items, key = text, "text"
    else:
        return None
    if not items:
        raise EngineRequestError(f"{key} is an empty batch")
    bodies = []
    for i, item in enumerate(items):
        body = {k: v for k, v in payload.items() if k not in ("input_ids", "text")}
        body[key] = item
        for name in ("sampling_params", "rid"):
            value = payload.get(name)
            if isinstance(value, list):
                if len(value) != len(items):
                    raise EngineRequestError(f"{name} has {len(value)} entries for a batch of {len(items)}")
                body[name] = value[i]
        bodies.append(body)
    return bodies
