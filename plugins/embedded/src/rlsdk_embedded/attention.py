"""Decode-step attention for the embedded engine on CPU, registered with transformers as ``rlsdk_grouped``.

A decode step has one query per row over a left-padded cache, so it needs a padding mask. With a mask,
transformers' SDPA path first copies every key and value head once per query head sharing it
(``repeat_kv``) and builds a new mask each step. Here each key/value head serves its query group in
place (two batched matrix products and a softmax, as in transformers' eager attention, without the
copies), under the boolean mask ``(B, 1, 1, L)`` the engine passes in. Prompts (several queries per
row) and anything unusual (sliding windows, attention sinks, float masks) go to SDPA unchanged.

About 8% more tokens/s than SDPA for SmolLM2-135M on two CPU cores. On CUDA the engine uses it for
static decode steps (whole cache buffers under a mask, see ``static_decode``); eager steps there keep
SDPA, whose fused kernels beat these small batched products when every kernel is launched from Python.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "rlsdk_grouped"


def grouped_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention in transformers' interface: ``query (B, H, q, D)``, ``key``/``value (B, Hkv, L, D)``;
    returns ``(B, q, H, D)``."""
    batch, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    plain = (
        queries == 1
        and attention_mask is not None
        and attention_mask.dtype == torch.bool
        and heads % kv_heads == 0
        and not kwargs.get("sliding_window")
        and kwargs.get("s_aux") is None
    )
    if not plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    assert attention_mask is not None  # ``plain`` checked it
    grouped = query.view(
        batch, kv_heads, heads // kv_heads, dim
    )  # query head h reads key/value head h // group
    scores = torch.matmul(grouped, key.transpose(-1, -2)) * (dim**-0.5 if scaling is None else scaling)
    scores = scores.masked_fill(~attention_mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    return torch.matmul(probs, value).view(batch, 1, heads, dim), None


def register() -> str:
    """Make ``rlsdk_grouped`` known to transformers (attention and mask building); returns the name."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(NAME, grouped_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def full_attention_only(config: Any) -> bool:
    """Whether every layer of the model attends to the whole context (no sliding windows)."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        return set(layer_types) == {"full_attention"}
    return not getattr(config, "sliding_window", None) or getattr(config, "use_sliding_window", True) is False


def sdpa_without_cudnn() -> AbstractContextManager[None]:
    """SDPA limited to its flash, memory-efficient and math kernels, for the engine's steps on CUDA.

    With a padding mask, torch 2.11 on an H200 picks cuDNN attention, which builds a plan for every new
    key length: 58 ms the first time a length is seen, 0.2 ms after. A decode step's cache is one column
    longer than the last, so every step of a pass over new lengths paid it (3.3k tokens/s instead of
    12.8k for the bench model at batch 256); the memory-efficient kernel has no per-length set-up."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
