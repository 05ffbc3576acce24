"""Decode steps over fixed tensors, captured once as a CUDA graph and replayed while the batch keeps its
cache buffers. Everything here runs on the engine's torch thread.

An eager decode step of a 0.5B model launches a few thousand small kernels from Python: on an H100 at
batch 256 the GPU worked 5.1 ms of a 13.8 ms step, so the engine ran only as fast as one CPU core (and
varied with it). A static step writes the new token's keys and values into the cache
buffers at a column held in a tensor and attends over every buffer column under a 4D mask, so the
same kernels with the same arguments serve every step until the buffers change (a row joins or
leaves, or the buffers fill up); on CUDA they are replayed from a graph with one launch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_FREE_COLUMNS = 16
"""A static step is set up only if its buffers have room for at least this many more tokens."""
WORTH_STEPS = 16
"""Steps a capture must serve to pay for itself (on an H100 a capture cost about 30-50 ms, four to seven
replayed steps of the bench model at batch 256): fewer, and the batch waits longer before the next one."""
MAX_WAIT = 64
"""The most eager steps a set of buffers must serve before a static step is set up on them."""


class _ColumnWriter(DynamicLayer):
    """A cache layer over whole buffers ``(B, H, C, D)``: each update writes its one column at ``column``
    and returns the buffers (the mask hides the columns not in use)."""

    keys: torch.Tensor  # set from __init__ on, unlike DynamicLayer's (None until its first update)
    values: torch.Tensor

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, column: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values, self.column = keys, values, column
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys.index_copy_(2, self.column, key_states)
        self.values.index_copy_(2, self.column, value_states)
        return self.keys, self.values


class StaticDecode:
    """Decode steps for one set of cache buffers (``buffers``: each layer's keys and values, ``(B, H, C, D)``)
    whose first ``length`` columns are in use under ``mask`` ``(B, length)``.

    ``step`` takes the rows' next input tokens and returns their logits ``(B, V)``; the logits tensor is
    reused by the next step. With a ``recorder`` (CUDA) the first step captures the forward pass as a
    graph and every step replays it; without, each step runs it eagerly."""

    def __init__(
        self,
        model: Any,
        cache_arg: str,
        buffers: list[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor,
        recorder: GraphRecorder | None = None,
    ) -> None:
        self.model, self.cache_arg, self.recorder = model, cache_arg, recorder
        self.buffers = buffers
        rows, self.length = mask.shape
        self.columns = buffers[0][0].shape[-2]
        for buffer in (b for pair in buffers for b in pair):  # masked columns must be finite: 0 * nan is nan
            buffer[..., self.length :, :].zero_()
        self.mask = mask.new_zeros(rows, self.columns)
        self.mask[:, : self.length] = mask
        self.column = torch.zeros(1, dtype=torch.long, device=mask.device)
        self.tokens = torch.zeros(rows, 1, dtype=torch.long, device=mask.device)
        self.cache = DynamicCache()
        self.cache.layers = [_ColumnWriter(keys, values, self.column) for keys, values in buffers]
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        self.steps = 0

    def fits(self, buffers: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
        """Whether a step can run on these buffers: the same ones, with a free column left."""
        return self.length < self.columns and all(a is b for a, b in zip(buffers, self.buffers))

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.tokens.copy_(tokens[:, None])
        self.column.fill_(self.length)
        self.mask[:, self.length] = True
        self.length += 1
        self.steps += 1
        if self.recorder is None:
            return self._forward()
        if self.graph is None:  # a replay repeats the same writes, so running the step first is harmless
            self.graph, self.logits = self.recorder.capture(self._forward)
        self.graph.replay()
        assert self.logits is not None  # captured with the graph
        return self.logits

    def _forward(self) -> torch.Tensor:
        positions = self.mask.sum(-1, keepdim=True) - 1  # the new token's index among its row's real tokens
        out = self.model(
            input_ids=self.tokens,
            attention_mask=self.mask[:, None, None, :],
            position_ids=positions,
            use_cache=True,
            **{self.cache_arg: self.cache},
        )
        return out.logits[:, -1, :].float()


class GraphRecorder:
    """What every captured step of one engine shares: the capture stream (captures cannot run on the
    default stream). Each graph gets its own memory pool, freed with it: a pool shared by graphs that
    come and go one after another cannot be reused once the last of them is gone."""

    def __init__(self) -> None:
        self.stream = torch.cuda.Stream()
        self.warm = False

    def capture(self, forward: Callable[[], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """``forward`` recorded as a graph, and its output tensor. The first capture runs ``forward`` once
        on the capture stream first (libraries set up their per-stream handles there)."""
        self.stream.wait_stream(torch.cuda.current_stream())
        if not self.warm:
            with torch.cuda.stream(self.stream):
                forward()
            self.warm = True
        graph = torch.cuda.CUDAGraph()
        # ``torch.cuda.graph`` would also collect garbage and empty the allocator's cache on every capture
        with torch.cuda.stream(self.stream):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                out = forward()
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(self.stream)
        return graph, out
