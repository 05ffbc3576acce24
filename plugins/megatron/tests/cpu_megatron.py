"""megatron-core on CPU for the tests (imported by them and, by file path, by the rank processes).

megatron-core 0.19 assumes CUDA in three places a float32, dropout-free forward and backward does not
need, which :func:`patch_for_cpu` points at the CPU: the rotary frequencies are moved to
``torch.cuda.current_device()``, the default causal mask is allocated on ``"cuda"``, and attention
dropout forks the CUDA RNG tracker. Everything else is megatron's real code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch


class _NoDropoutRng:
    def fork(self, *args: Any, **kwargs: Any) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()


def patch_for_cpu(set_attribute: Callable[[Any, str, Any], None] = setattr) -> None:
    """Apply the three patches with ``set_attribute`` (``monkeypatch.setattr`` to undo them later)."""
    from megatron.core import tensor_parallel
    from megatron.core.fusions import fused_softmax

    set_attribute(torch.cuda, "current_device", lambda: "cpu")
    set_attribute(
        fused_softmax, "get_default_causal_mask", lambda sq: torch.ones(sq, sq, dtype=torch.bool).triu(1)
    )
    set_attribute(tensor_parallel, "get_cuda_rng_tracker", lambda *args, **kwargs: _NoDropoutRng())


def cpu_trainer(args: Any) -> Any:
    """A rank's ``MegatronTrainer`` on the CPU (one thread: the ranks share the machine)."""
    from rlsdk_megatron.trainer import MegatronTrainer

    patch_for_cpu()
    torch.set_num_threads(1)
    return MegatronTrainer(args, torch.device("cpu"))
