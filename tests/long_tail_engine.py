"""A scripted engine and byte tokenizer for deterministic rollout-loop tests.

The real engines (the embedded transformers engine and the SGLang client against ``rlsdk serve``) are
tested with the real small model in their own tests and end to end in ``test_run_e2e.py``. These
tests need what a real model cannot give: exact control over which request is still running when a
step ends, so that aborts and partial rollouts happen at known points.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from rlsdk.engine import InferenceEngine

Script = Callable[[str, list[int]], tuple[str, int | None]]
"""(prompt text, response ids so far) -> (full response text, block after this many new tokens or None)."""


class LongTailEngine(InferenceEngine):
    """Answers each request with a scripted response. A request told to block is a long-tail request:
    it emits its first tokens, then finishes after ``slow_seconds`` unless aborted first, in which
    case it returns those tokens with ``finish_reason`` ``abort``."""

    def __init__(self, script: Script, prompt_len: Callable[[list[int]], int], slow_seconds: float = 10.0) -> None:
        self.script = script
        self.prompt_len = prompt_len
        self.slow_seconds = slow_seconds
        self.requests: list[dict[str, Any]] = []
        self._blocked: list[asyncio.Future[None]] = []
        self.aborts = 0

    async def generate(self, payload: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(payload)
        ids = payload["input_ids"]
        start = self.prompt_len(ids)
        prompt = bytes(ids[:start]).decode()
        text, block_after = self.script(prompt, ids[start:])
        new = list(text.encode())[len(ids) - start:][: payload["sampling_params"]["max_new_tokens"]]
        finish: dict[str, Any] = {"type": "length" if len(new) == payload["sampling_params"]["max_new_tokens"]
                                  else "stop", "matched": 0}
        await asyncio.sleep(0)
        if block_after is not None and block_after < len(new):
            blocked = asyncio.get_running_loop().create_future()
            self._blocked.append(blocked)
            try:
                await asyncio.wait_for(asyncio.shield(blocked), self.slow_seconds)
                new = new[:block_after]
                finish = {"type": "abort", "message": "Aborted"}
            except TimeoutError:
                self._blocked.remove(blocked)
        return {
            "text": bytes(new).decode(errors="replace"),
            "output_ids": new,
            "meta_info": {
                "id": str(len(self.requests)),
                "finish_reason": finish,
                "prompt_tokens": len(ids),
                "completion_tokens": len(new),
                "output_token_logprobs": [[-0.5, t, None] for t in new],
                "weight_version": "default",
            },
        }

    async def abort(self, rid: str | None = None) -> None:
        self.aborts += 1
        blocked, self._blocked = self._blocked, []
        for future in blocked:
            if not future.done():
                future.set_result(None)

    async def model_info(self) -> dict[str, Any]:
        return {"model_path": "scripted", "weight_version": "default"}
