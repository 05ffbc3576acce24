"""The running batch's tensors: a left-padded KV cache that rows join (prefill, then merge) and leave
(select) between decode steps. Everything here runs on the engine's torch thread."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .static_decode import MAX_WAIT, MIN_FREE_COLUMNS, WORTH_STEPS, GraphRecorder, StaticDecode

MIN_SHARED_PREFIX = 16
"""Distinct prompts prefilled together run their common prefix once when it has at least this many tokens."""

SLACK = 128
"""Free token columns a cache buffer gets beyond its contents: decode steps write their token in place,
and the cache is copied once every ``SLACK`` steps instead of on every step."""


class SlackLayer(DynamicLayer):
    """A full-attention cache layer whose ``keys`` and ``values`` ``(B, H, L, D)`` are views into
    buffers with room for more columns. transformers' ``DynamicLayer`` concatenates on every update,
    which copies the whole cache each decode step (for a 0.5B model at batch 256, gigabytes per step)
    and hands the memory allocator a new size every time.

    Built from ``parts``: blocks of rows stacked in order, each right-aligned to the longest (left
    padding zeroed: masked columns must still be finite, as ``0 * nan`` poisons attention)."""

    keys: torch.Tensor  # set from __init__ on, unlike DynamicLayer's (None until its first update)
    values: torch.Tensor
    buffers: tuple[torch.Tensor, torch.Tensor]

    def __init__(self, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        super().__init__()
        keys = parts[0][0]
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._fill(parts, 0)

    def _fill(self, parts: list[tuple[torch.Tensor, torch.Tensor]], incoming: int) -> None:
        """New buffers holding ``parts``, with room for ``incoming`` more columns plus the slack."""
        length = max(k.shape[-2] for k, _ in parts)
        rows = sum(k.shape[0] for k, _ in parts)
        # whole multiples of 64 columns: static decode steps attend over every column, and matrix
        # products over an odd number of columns fall back to kernels several times slower on CUDA
        columns = -(-(length + incoming + SLACK) // 64) * 64
        keys, values = (t.new_empty((rows, *t.shape[1:-2], columns, t.shape[-1])) for t in parts[0])
        self.buffers = keys, values
        first = 0
        for part in parts:
            pad = length - part[0].shape[-2]
            for buffer, t in zip(self.buffers, part):
                block = buffer[first : first + t.shape[0]]
                block[..., :pad, :].zero_()
                block[..., pad:length, :].copy_(t)
            first += part[0].shape[0]
        self.use(length)

    def use(self, length: int) -> None:
        """Make ``keys`` and ``values`` the buffers' first ``length`` columns."""
        self.keys, self.values = (b[..., :length, :] for b in self.buffers)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        length, incoming = self.keys.shape[-2], key_states.shape[-2]
        # anything that replaced the views (a batch select, an offload) gets new buffers
        views = (self.keys, self.values)
        own = all(view.data_ptr() == buffer.data_ptr() for view, buffer in zip(views, self.buffers))
        if not own or length + incoming > self.buffers[0].shape[-2]:
            self._fill([(self.keys, self.values)], incoming)
        for buffer, new in zip(self.buffers, (key_states, value_states)):
            buffer[..., length : length + incoming, :].copy_(new)
        self.use(length + incoming)
        return self.keys, self.values


def slack_cache(layers: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> DynamicCache:
    """A cache of ``SlackLayer``, one per item of ``layers`` (that layer's parts)."""
    cache = DynamicCache()
    cache.layers = [SlackLayer(parts) for parts in layers]
    return cache


class KVBatch:
    """The KV cache, boolean attention mask ``(B, L)`` and next input tokens ``(B,)`` of the running rows.

    Rows are left-padded to a common length; a row's position ids count only its real tokens, so a
    row's logits do not depend on which other rows share the batch (up to float rounding)."""

    def __init__(self, model: Any, boolean_decode_mask: bool = False, static_decode: bool = False) -> None:
        self.model = model
        self.boolean_decode_mask = boolean_decode_mask
        """Decode with the ready 4D boolean mask ``(B, 1, 1, L)`` (the ``rlsdk_grouped`` attention's input)
        instead of having transformers build one from the 2D mask every step."""
        self.static_decode = static_decode
        """Decode with :class:`StaticDecode` steps while the buffers stay the same (full-attention caches
        only), replayed from CUDA graphs on CUDA; the first steps on new buffers run eagerly (see ``_wait``)."""
        self.device = next(model.parameters()).device
        # transformers 5.2x names the cache argument ``cache``; earlier releases ``past_key_values``
        self.cache_arg = (
            "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        )
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None
        self.tokens: torch.Tensor | None = None
        self._static: StaticDecode | None = None
        """While set, the current length is its ``length`` and the cache's views and ``mask`` lag behind."""
        self._eager_buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        """The first layer's buffers after the last eager decode step, which ``_eager_run`` steps in a row
        used: a static step is set up on buffers that served ``_wait`` eager steps. The wait doubles when
        a static step's buffers change within ``WORTH_STEPS`` steps (rows joining or leaving every few
        steps would otherwise pay a capture each time) and halves when they last."""
        self._eager_run = 0
        self._wait = 1
        self._recorder = GraphRecorder() if static_decode and self.device.type == "cuda" else None

    @property
    def size(self) -> int:
        return 0 if self.mask is None else self.mask.shape[0]

    @property
    def mergeable(self) -> bool:
        """Whether new rows can join a running cache."""
        return self.cache is None or _full_attention(self.cache)

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        """Run ``prompts`` as new rows appended to the batch; returns their last logits ``(n, V)``.

        Each distinct prompt runs once (a group's samples share theirs); its cache and logits are then
        copied to every row that asked for it. The distinct prompts' common prefix (a system prompt, a
        few-shot example) runs once too when it is at least ``MIN_SHARED_PREFIX`` tokens: its cache is
        copied to every prompt, whose remaining tokens then run on it, left-padded."""
        distinct: dict[tuple[int, ...], int] = {}
        rows = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        unique = [list(p) for p in distinct]
        shared = _common_prefix(unique) if len(unique) > 1 else 0
        cache = DynamicCache(config=self.model.config)
        if shared < MIN_SHARED_PREFIX:
            shared = 0
        else:
            prefix = torch.tensor([unique[0][:shared]], device=self.device)
            self._forward(prefix, None, torch.arange(shared, device=self.device)[None], cache)
            cache.batch_repeat_interleave(len(unique))
        rest = [p[shared:] for p in unique]
        length = max(len(p) for p in rest)
        pad = self.model.config.pad_token_id or 0
        ids = torch.tensor([[pad] * (length - len(p)) + p for p in rest], device=self.device)
        mask = torch.tensor([[False] * (length - len(p)) + [True] * len(p) for p in rest], device=self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0) + shared
        mask = torch.cat([mask.new_ones(len(rest), shared), mask], dim=1)
        cache, logits = self._forward(ids, mask, positions, cache)
        if len(unique) < len(prompts):
            index = torch.tensor(rows, device=self.device)
            cache.batch_select_indices(index)
            mask, logits = mask[index], logits[index]
        self._append(cache, mask)
        return logits

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor | None, positions: torch.Tensor, cache: DynamicCache
    ) -> tuple[DynamicCache, torch.Tensor]:
        """A prefill forward of ``ids`` on ``cache``; returns the cache and each row's last logits
        ``(n, V)`` in float32."""
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_arg: cache},
        )
        return getattr(out, self.cache_arg), out.logits[:, -1, :].float()

    def decode(self) -> torch.Tensor:
        """One step for every row, feeding ``tokens``; returns the next logits ``(B, V)`` (on a static
        step, a tensor the next step overwrites)."""
        assert self.mask is not None and self.tokens is not None and self.cache is not None
        if self.static_decode and self.mergeable:
            buffers = [_slack(layer).buffers for layer in self.cache.layers]
            if self._static is not None and self._static.fits(buffers):
                return self._static.step(self.tokens)
            self._settle()
            if (
                buffers[0] is self._eager_buffers
                and self._eager_run >= self._wait
                and buffers[0][0].shape[-2] - self.mask.shape[1] >= MIN_FREE_COLUMNS
            ):
                self._static = StaticDecode(self.model, self.cache_arg, buffers, self.mask, self._recorder)
                return self._static.step(self.tokens)
        positions = self.mask.sum(-1, keepdim=True)
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.size, 1)], dim=1)
        mask = self.mask[:, None, None, :] if self.boolean_decode_mask else self.mask
        out = self.model(
            input_ids=self.tokens[:, None],
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self.cache_arg: self.cache},
        )
        self.cache = getattr(out, self.cache_arg)
        if self.static_decode and self.mergeable:
            first = _slack(self.cache.layers[0]).buffers
            self._eager_run = self._eager_run + 1 if first is self._eager_buffers else 1
            self._eager_buffers = first
        return out.logits[:, -1, :].float()

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in this order), dropping padding columns no remaining row needs."""
        self._settle()
        if not rows:
            self.cache = self.mask = self.tokens = None
            return
        assert self.mask is not None and self.cache is not None and self.tokens is not None
        index = torch.tensor(rows, device=self.device)
        mask = self.mask[index]
        start = int(mask.any(0).long().argmax())  # first column some row uses
        if self.mergeable:
            self.cache = slack_cache(
                [
                    [(keys[index, :, start:], values[index, :, start:])]
                    for keys, values in _keys_values(self.cache)
                ]
            )
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

    def settle(self) -> None:
        """End the static steps (their graphs read the weights' storage): the next decode step runs eagerly."""
        self._settle()

    def _settle(self) -> None:
        """End the static steps: bring the cache's views and ``mask`` up to their length."""
        if self._static is None:
            return
        assert self.cache is not None  # static steps run on a cache
        length = self._static.length
        for layer in self.cache.layers:
            _slack(layer).use(length)
        self.mask = self._static.mask[:, :length]
        worth = self._static.steps >= WORTH_STEPS
        self._wait = max(1, self._wait // 2) if worth else min(MAX_WAIT, self._wait * 2)
        self._static = None

    def _append(self, cache: DynamicCache, mask: torch.Tensor) -> None:
        self._settle()
        if self.cache is None or self.mask is None:
            full = _full_attention(cache)
            self.cache = slack_cache([[pair] for pair in _keys_values(cache)]) if full else cache
            self.mask = mask
            return
        width = max(self.mask.shape[1], mask.shape[1])
        self.cache = slack_cache([[a, b] for a, b in zip(_keys_values(self.cache), _keys_values(cache))])
        self.mask = torch.cat([_left_pad(self.mask, width), _left_pad(mask, width)])


def _common_prefix(prompts: list[list[int]]) -> int:
    """The length of the prompts' common prefix, short of the shortest prompt's last token (whose logits
    each prompt needs)."""
    shortest = min(len(p) for p in prompts) - 1
    first = prompts[0]
    for i in range(shortest):
        if any(p[i] != first[i] for p in prompts):
            return i
    return max(shortest, 0)


def _full_attention(cache: DynamicCache) -> bool:
    """Whether every layer is a plain full-attention one (no sliding window): such layers can be
    merged, selected and kept in ``SlackLayer`` buffers."""
    return all(type(layer) in (DynamicLayer, SlackLayer) for layer in cache.layers)


def _slack(layer: object) -> SlackLayer:
    """``layer`` of a mergeable batch's cache, which ``slack_cache`` built."""
    assert isinstance(layer, SlackLayer), type(layer)
    return layer


def _keys_values(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's keys and values, of a full-attention cache that holds tokens."""
    pairs = []
    for layer in cache.layers:
        assert isinstance(layer, DynamicLayer) and layer.keys is not None and layer.values is not None
        pairs.append((layer.keys, layer.values))
    return pairs


def _left_pad(mask: torch.Tensor, width: int) -> torch.Tensor:
    """Pad a ``(B, L)`` mask with ``False`` on the left to ``width`` columns."""
    missing = width - mask.shape[1]
    return mask if missing == 0 else torch.cat([mask.new_zeros(mask.shape[0], missing), mask], dim=1)
