"""RMSNorm for ``GPTModel``'s local layer spec under sequence parallelism.

megatron-core's own torch norm (the local spec's, without Apex or Transformer Engine) refuses sequence
parallelism, which megatron needs for MoE layers with tensor parallelism. This is torch's ``RMSNorm``
built as megatron builds its norms, its weight marked ``sequence_parallel`` when the config is: each
tensor-parallel rank then normalises its part of the sequence (or, for Qwen3's query and key norms, its
own heads), so its gradient is a part the trainer sums over the ranks.
"""

from __future__ import annotations

from typing import Any

import torch


class SequenceParallelRMSNorm(torch.nn.RMSNorm):
    """``RMSNorm(config, hidden_size, eps)``, as megatron's layer specs call a norm."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **kwargs: Any) -> None:
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        self.weight.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]
