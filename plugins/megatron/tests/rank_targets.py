"""Objects a :class:`~rlsdk_megatron.rank_group.RankGroup` builds on every rank in the tests (loaded by
file path in the rank processes)."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist


class Summer:
    """Sums a value over the ranks; fails or exits on one rank when asked."""

    def __init__(self, args: Any) -> None:
        self.scale = args.lr
        self.device, self.dtype = torch.device("cpu"), torch.float32

    def total(self, value: float) -> float:
        tensor = torch.tensor([value * self.scale])
        dist.all_reduce(tensor)
        return float(tensor)

    def raise_on(self, rank: int) -> float:
        if dist.get_rank() == rank:
            raise RuntimeError(f"failing on rank {rank} on purpose")
        return self.total(1.0)

    def exit_on(self, rank: int) -> float:
        if dist.get_rank() == rank:
            os._exit(3)
        return self.total(1.0)

    def running_totals(self, count: int) -> Any:
        """``count`` sums over the ranks, one at a time (a generator, as a trainer's weight buckets)."""
        for value in range(count):
            yield self.total(float(value))
