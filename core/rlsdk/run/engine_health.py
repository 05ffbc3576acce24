"""The engine's health check before a run's first step: one tiny generation, its answer read as a rollout
reads one. A dead port, a server that answers errors and one that answers something other than SGLang's
protocol stop the run here, naming the engine, before any prompt is taken from the data."""

from __future__ import annotations

import asyncio
from typing import Any

from ..plugins.records import Resolved
from ..engines.protocol import GENERATE_RESPONSE, EngineError, check_generate_response, unreadable

PROBE = {
    "input_ids": [0],
    "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
    "return_logprob": True,
}
"""The request SGLang's own ``/health_generate`` sends: one greedy token after token id 0."""


class EngineHealthError(EngineError):
    """The engine failed its health check: the run stops before its first step."""


async def check_engine_health(engine: Any, resolved: Resolved, timeout: float | None) -> None:
    """Send :data:`PROBE` and read the answer; :class:`EngineHealthError` naming the engine (its plugin and
    URL) and what failed, when it cannot be reached, answers an error, hangs past ``timeout`` seconds or
    answers something that is not a finished ``/generate`` response."""
    where = f"{resolved.describe()}" + (f" at {engine.url}" if engine.url else "")
    source = f"{engine.url}/generate" if engine.url else where
    try:
        answer = await asyncio.wait_for(engine.generate(dict(PROBE)), timeout)
        check_generate_response(answer, source)
        if not isinstance(answer, dict):
            raise unreadable(source, "a list for a single request", GENERATE_RESPONSE, answer)
        finish = answer["meta_info"].get("finish_reason")
        if finish is None or finish["type"] not in ("stop", "length"):
            raise EngineError(
                f"a one-token generation ended with finish_reason {finish!r}, expected the "
                "type stop or length"
            )
    except TimeoutError:
        raise EngineHealthError(
            f"{where} failed its health check: no answer to a one-token generation within "
            f"{timeout:g}s (generate_timeout); no step ran, no data was used"
        ) from None
    except Exception as exc:
        raise EngineHealthError(
            f"{where} failed its health check: {exc}; no step ran, no data was used"
        ) from exc
