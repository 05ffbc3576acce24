"""State dicts through Ray's object store as numpy arrays, which a reader maps without copying them; torch
tensors would be pickled and copied on every read (SmolLM2-135M's 540 MB: 1.3-1.8 s per engine on 2 busy
cores, against 0.01-0.13 s). Tensors that share memory (tied embeddings) travel once."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch

_SAME_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
"""Integer dtypes to view tensors numpy has no dtype for (bfloat16, float8) as, by element size."""


def to_shared(state_dict: Mapping[str, torch.Tensor]) -> dict[str, tuple[Any, str]]:
    """``{name: (numpy array, torch dtype name)}`` on the CPU; a tensor sharing an earlier one's memory
    and shape is ``(that name, "alias")``."""
    shared: dict[str, tuple[Any, str]] = {}
    seen: dict[tuple[int, tuple[int, ...], torch.dtype], str] = {}
    for name, tensor in state_dict.items():
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if key in seen:
            shared[name] = (seen[key], "alias")
            continue
        seen[key] = name
        host = tensor.detach().to("cpu").contiguous()
        try:
            array = host.numpy()
        except TypeError:  # no numpy dtype: travels as integers of the same width
            array = host.view(_SAME_WIDTH[host.element_size()]).numpy()
        shared[name] = (array, str(host.dtype).removeprefix("torch."))
    return shared


def from_shared(shared: Mapping[str, tuple[Any, str]]) -> dict[str, torch.Tensor]:
    """The state dict of :func:`to_shared`'s result, its tensors on the (read-only) arrays Ray mapped."""
    tensors: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():  # read-only arrays: the engines only copy from them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, (array, dtype) in shared.items():  # an alias names an earlier tensor
            tensors[name] = (
                tensors[array] if dtype == "alias" else torch.from_numpy(array).view(getattr(torch, dtype))
            )
    return tensors
