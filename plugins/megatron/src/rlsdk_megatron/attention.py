"""Core attention for ``GPTModel``'s local layer spec through torch's ``scaled_dot_product_attention``.

megatron-core's own ``DotProductAttention`` (the local spec's, without Transformer Engine) copies every
key/value head once per query head sharing it, materialises the ``[b, heads, s, s]`` scores and runs a
separate softmax. SDPA computes the same causal attention in fused kernels (flash or memory-efficient on
CUDA), serving each key/value group in place. Causal self-attention only, with no mask tensor: the
trainer's right-padded rows need nothing else (padding comes after every real token).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule


class SDPAttention(MegatronModule):
    """A drop-in for megatron-core's ``DotProductAttention`` (same constructor and forward), causal only."""

    def __init__(
        self,
        config: Any,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(config=config)
        if attn_mask_type != AttnMaskType.causal:
            raise ValueError(f"rlsdk-megatron's SDPA attention is causal only, not {attn_mask_type}")
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(config.kv_channels)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        """``query [s, b, heads, d]``, ``key``/``value [s, b, groups, d]`` -> ``[s, b, heads * d]``."""
        if attention_mask is not None or attention_bias is not None or packed_seq_params is not None:
            raise ValueError("rlsdk-megatron's SDPA attention takes no mask, bias or packed sequences")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        out = torch.nn.functional.scaled_dot_product_attention(
            q,
            k,
            v,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=True,
            scale=self.softmax_scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )
        return out.permute(2, 0, 1, 3).flatten(2)
