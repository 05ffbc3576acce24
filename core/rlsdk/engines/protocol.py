"""SGLang's native protocol as SGLang 0.5.17 speaks it: errors, finish reasons, response bodies.

Shared by every engine that answers ``/generate`` itself (the embedded engine) and by the HTTP server
in :mod:`rlsdk.run.engine_server`, so both follow the real server's shapes (captured in
``tests/fixtures/sglang-0.5.17.json``).
"""

from __future__ import annotations

import json
import time
from typing import Any

from ..errors import RlsdkError

SERVE_TOKEN_ENV = "RLSDK_SERVE_TOKEN"
"""The bearer token ``rlsdk serve`` requires off loopback, and the engine client sends when it is set."""
BUFFER_TOKEN_ENV = "RLSDK_BUFFER_TOKEN"
"""The bearer token ``rlsdk buffer serve`` requires off loopback, and its clients send when it is set."""


class EngineError(RlsdkError):
    """An engine failed to answer a request."""


class EngineRequestError(EngineError, ValueError):
    """A malformed request: the HTTP server answers 400 with SGLang's error body."""


class EngineUnavailableError(EngineError, ConnectionError):
    """The engine could not be reached (after retries)."""


class ReplicaLostError(EngineError):
    """One engine of a pool died while it was asked on its own (the trust check's probe): the pool brings it
    back and checks it before it rejoins."""


class EngineResponseError(EngineError):
    """The engine answered something that is not an answer of SGLang's protocol (not JSON, wrong shape)."""


GENERATE_RESPONSE = (
    '{"text": str, "meta_info": {"finish_reason": {"type": "stop"|"length"|"abort", ...} or null, '
    '"output_token_logprobs": [[logprob, token_id, text], ...], ...}, ...}'
)
"""What a ``/generate`` answer looks like, for error messages."""

SHOWN_CHARS = 200
"""How much of an unreadable answer an error message quotes."""


def unreadable(source: str, problem: str, expected: str, got: Any) -> EngineResponseError:
    """The error for an answer of ``source`` (an engine's URL and path) that cannot be read."""
    text = got if isinstance(got, str) else json.dumps(got, default=repr)
    shown = repr(text[:SHOWN_CHARS]) + (f" ... ({len(text)} characters)" if len(text) > SHOWN_CHARS else "")
    return EngineResponseError(f"{source}: {problem}; expected {expected}, got {shown}")


def check_generate_response(answer: Any, source: str) -> Any:
    """``answer`` if it has the shape of a ``/generate`` response (a list of them for a batch body), else
    :class:`EngineResponseError` naming ``source``. Checks the structure and the first log-prob entry, not
    every entry (a few microseconds an answer however long it is); a bad later entry fails its sample when
    it is read."""
    for item in answer if isinstance(answer, list) and answer else [answer]:
        problem = _generate_response_problem(item)
        if problem:
            raise unreadable(source, f"unreadable /generate answer ({problem})", GENERATE_RESPONSE, answer)
    return answer


def _generate_response_problem(item: Any) -> str | None:
    if not isinstance(item, dict):
        return f"a JSON {type(item).__name__}, not an object"
    meta = item.get("meta_info")
    if not isinstance(meta, dict):
        return "no meta_info object"
    if not isinstance(item.get("text", ""), str):
        return "text is not a string"
    finish = meta.get("finish_reason")
    if finish is not None and not (isinstance(finish, dict) and isinstance(finish.get("type"), str)):
        return "finish_reason is neither null nor an object with a type"
    entries = meta.get("output_token_logprobs")
    if entries is None:
        return None
    if not isinstance(entries, list):
        return "output_token_logprobs is not a list"
    if entries and not _is_logprob_entry(entries[0]):
        return "output_token_logprobs entries are not [logprob, token_id, ...]"
    return None


def _is_logprob_entry(entry: Any) -> bool:
    return (
        isinstance(entry, list)
        and len(entry) >= 2
        and isinstance(entry[0], int | float)
        and isinstance(entry[1], int)
        and not isinstance(entry[1], bool)
    )


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
    import uuid  # imported on first use: uuid imports platform, which `import rlsdk` does not need

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
