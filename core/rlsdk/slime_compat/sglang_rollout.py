"""Stands in for ``slime.rollout.sglang_rollout``: rlsdk's ``sglang`` rollout and default generator, and
the ``GenerateState`` that slime's custom generators read (tokenizer, sampling parameters, semaphore)."""

from __future__ import annotations

from argparse import Namespace
import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Self

from ..rollout.generate import generate
from ..rollout.step import generate_rollout
from ..runtime import get_runtime

__all__ = ["GenerateState", "generate", "generate_rollout", "get_model_url"]


class GenerateState:
    """The generation state, one per run (slime has one per process; a process may hold several rlsdk
    runs), kept in the run's scratch space; later ``args`` of the same run are ignored, as in slime."""

    def __new__(cls, args: Namespace) -> Self:
        scratch = get_runtime(args).state
        if "slime.GenerateState" not in scratch:
            state = super().__new__(cls)
            state._start(args)
            scratch["slime.GenerateState"] = state
        return scratch["slime.GenerateState"]

    def _start(self, args: Namespace) -> None:
        self.args = args
        self.tokenizer = get_runtime(args).tokenizer
        self.processor = None
        self.semaphore = asyncio.Semaphore(args.sglang_server_concurrency)
        self.sampling_params: dict[str, Any] = {
            "temperature": args.rollout_temperature,
            "top_p": args.rollout_top_p,
            "top_k": args.rollout_top_k,
            "max_new_tokens": args.rollout_max_response_len,
            "stop": args.rollout_stop,
            "stop_token_ids": args.rollout_stop_token_ids,
            "skip_special_tokens": args.rollout_skip_special_tokens,
            "no_stop_trim": True,
            "spaces_between_special_tokens": False,
        }
        self.group_sampling_seeds = [args.rollout_seed + i for i in range(args.n_samples_per_prompt)]
        self.dp_counts = [0] * (getattr(args, "sglang_dp_size", None) or 1)
        self.dp_rank = 0
        self.reset()

    def reset(self) -> None:
        self.remaining_batch_size = 0
        self.pendings: set[asyncio.Task] = set()
        self.aborted = False

    @contextmanager
    def dp_rank_context(self) -> Iterator[int]:
        """The least loaded data-parallel rank (one engine here: rank 0 unless ``sglang_dp_size`` says more)."""
        rank = self.dp_counts.index(min(self.dp_counts))
        self.dp_counts[rank] += 1
        self.dp_rank = rank
        try:
            yield rank
        finally:
            self.dp_counts[rank] -= 1


def get_model_url(args: Namespace, model_name: str, endpoint: str = "/generate") -> str:
    """The URL of the run's engine endpoint (one model)."""
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}{endpoint}"
