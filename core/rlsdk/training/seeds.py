"""Seeds for every generator a run's process draws from, and torch's deterministic kernels: deterministic
mode (``--deterministic``) calls :func:`seed_everything` in the driver and in every trainer process."""

from __future__ import annotations

import importlib.util
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators (dropout, random filters and rewards) with ``seed`` and
    turn on torch's deterministic algorithms, cuDNN's among them (an operation that has none warns, naming
    itself). Attention runs on torch's math kernels: the memory-efficient kernel's backward pass is not
    deterministic (on one H200 it made two runs' gradients differ from the first step; torch only warns).
    NumPy and torch are imported only where they are installed."""
    random.seed(seed)
    if importlib.util.find_spec("numpy") is not None:
        import numpy

        numpy.random.seed(seed % 2**32)
    if importlib.util.find_spec("torch") is None:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's fixed workspace, read at its start
    import torch

    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_cudnn_sdp(False)


@contextmanager
def restored_afterwards() -> Iterator[None]:
    """What :func:`seed_everything` changes, as it was before once the block ends: the generators' states,
    torch's deterministic switches and attention kernels, cuBLAS's workspace setting. Deterministic mode lasts
    for its run, not for what the process does next (a notebook's next run, the next test)."""
    python = random.getstate()
    numpy = importlib.import_module("numpy") if importlib.util.find_spec("numpy") is not None else None
    numpy_state = numpy.random.get_state() if numpy is not None else None
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    torch: Any = importlib.import_module("torch") if importlib.util.find_spec("torch") is not None else None
    if torch is not None:
        cuda = torch.backends.cuda
        switches = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark,
            cuda.flash_sdp_enabled(),
            cuda.mem_efficient_sdp_enabled(),
            cuda.cudnn_sdp_enabled(),
        )
        torch_state = torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(python)
        if numpy is not None:
            numpy.random.set_state(numpy_state)
        if workspace is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace
        if torch is not None:
            algorithms, warn_only, cudnn_deterministic, benchmark, flash, efficient, cudnn_sdp = switches
            torch.use_deterministic_algorithms(algorithms, warn_only=warn_only)
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = (
                cudnn_deterministic,
                benchmark,
            )
            cuda.enable_flash_sdp(flash)
            cuda.enable_mem_efficient_sdp(efficient)
            cuda.enable_cudnn_sdp(cudnn_sdp)
            torch.set_rng_state(torch_state)
