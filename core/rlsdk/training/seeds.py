"""Seeds for every generator a run's process draws from, and torch's deterministic kernels: deterministic
mode (``--deterministic``) calls :func:`seed_everything` in the driver and in every trainer process."""

from __future__ import annotations

import importlib.util
import os
import random


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
