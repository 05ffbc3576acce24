"""The running batch's tensors: a left-padded KV cache that rows join (prefill, then merge) and leave
(select) between decode steps. Everything here runs on the engine's torch thread."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class KVBatch:
    """The KV cache, boolean attention mask ``(B, L)`` and next input tokens ``(B,)`` of the running rows.

    Rows are left-padded to a common length; a row's position ids count only its real tokens, so a
    row's logits do not depend on which other rows share the batch (up to float rounding)."""

    def __init__(self, model: Any, boolean_decode_mask: bool = False) -> None:
        self.model = model
        self.boolean_decode_mask = boolean_decode_mask
        """Decode with the ready 4D boolean mask ``(B, 1, 1, L)`` (the ``rlsdk_grouped`` attention's input)
        instead of having transformers build one from the 2D mask every step."""
        self.device = next(model.parameters()).device
        # transformers 5.2x names the cache argument ``cache``; earlier releases ``past_key_values``
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None
        self.tokens: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return 0 if self.mask is None else self.mask.shape[0]

    @property
    def mergeable(self) -> bool:
        """Whether new rows can join a running cache (plain full-attention layers only)."""
        return self.cache is None or all(type(layer) is DynamicLayer for layer in self.cache.layers)

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        """Run ``prompts`` as new rows appended to the batch; returns their last logits ``(n, V)``."""
        length = max(len(p) for p in prompts)
        pad = self.model.config.pad_token_id or 0
        ids = torch.tensor([[pad] * (length - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[False] * (length - len(p)) + [True] * len(p) for p in prompts], device=self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1, **{self.cache_arg: cache})
        self._append(getattr(out, self.cache_arg), mask)
        return out.logits[:, -1, :].float()

    def decode(self) -> torch.Tensor:
        """One step for every row, feeding ``tokens``; returns the next logits ``(B, V)``."""
        assert self.mask is not None and self.tokens is not None
        positions = self.mask.sum(-1, keepdim=True)
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.size, 1)], dim=1)
        mask = self.mask[:, None, None, :] if self.boolean_decode_mask else self.mask
        out = self.model(input_ids=self.tokens[:, None], attention_mask=mask, position_ids=positions,
                         use_cache=True, **{self.cache_arg: self.cache})
        self.cache = getattr(out, self.cache_arg)
        return out.logits[:, -1, :].float()

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in this order), dropping padding columns no remaining row needs."""
        if not rows:
            self.cache = self.mask = self.tokens = None
            return
        assert self.mask is not None and self.cache is not None and self.tokens is not None
        index = torch.tensor(rows, device=self.device)
        mask = self.mask[index]
        start = int(mask.any(0).long().argmax())  # first column some row uses
        if self.mergeable:
            layers = [(layer.keys[index, :, start:], layer.values[index, :, start:]) for layer in self.cache.layers]
            self.cache = DynamicCache(ddp_cache_data=layers)
            mask = mask[:, start:]
        else:
            self.cache.batch_select_indices(index)
        self.mask, self.tokens = mask, self.tokens[index]

    def set_tokens(self, tokens: torch.Tensor, first_row: int = 0) -> None:
        """The next input tokens of rows ``first_row`` onwards."""
        if self.tokens is None or first_row == 0:
            self.tokens = tokens
        else:
            self.tokens = torch.cat([self.tokens[:first_row], tokens])

    def _append(self, cache: DynamicCache, mask: torch.Tensor) -> None:
        if self.cache is None or self.mask is None:
            self.cache, self.mask = cache, mask
            return
        old, new = self.mask.shape[1], mask.shape[1]
        width = max(old, new)
        layers = [
            (torch.cat([_left_pad(a.keys, width), _left_pad(b.keys, width)]),
             torch.cat([_left_pad(a.values, width), _left_pad(b.values, width)]))
            for a, b in zip(self.cache.layers, cache.layers)
        ]
        self.cache = DynamicCache(ddp_cache_data=layers)
        self.mask = torch.cat([_left_pad(self.mask, width), _left_pad(mask, width)])


def _left_pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad the sequence dimension (-2 for KV ``(B, H, L, D)``, -1 for masks ``(B, L)``) on the left."""
    dim = -1 if t.dim() == 2 else -2
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)
