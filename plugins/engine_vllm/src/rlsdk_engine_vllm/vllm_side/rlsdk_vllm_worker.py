"""A vLLM worker extension (``vllm serve --worker-extension-cls rlsdk_vllm_worker.WeightChecksums``): the
checksum of every weight a vLLM worker holds, for rlsdk's trust check. Runs inside vLLM's worker processes,
in vLLM's environment: it imports vLLM and torch, never rlsdk's package (which need not be installed
there); the checksum algorithm is rlsdk's own file, loaded by path from ``$RLSDK_WEIGHT_CHECKSUMS`` (it uses
the standard library and torch only), so both sides compute the same one.

``/collective_rpc`` with ``{"method": "rlsdk_weight_checksums"}`` answers one result per worker:
``{"checksums": {name: checksum}, "fused": {".qkv_proj.": [".q_proj.", ...], ...}, "tp_rank", "tp_size"}``.
Names are vLLM's parameter names (a LoRA wrapper's ``.base_layer`` left out); ``fused`` is the model's own
``packed_modules_mapping``, which says which Hugging Face tensors each fused one concatenates; a vocabulary
vLLM padded to a multiple of 64 rows is hashed without the padding (the trainer's tensor has none).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

CHECKSUMS_ENV = "RLSDK_WEIGHT_CHECKSUMS"


MODULE = "rlsdk_weight_checksums"


def _checksum_module() -> Any:
    """rlsdk's checksum file as a module of its own (loaded once per worker)."""
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    path = os.environ.get(CHECKSUMS_ENV)
    if not path:
        raise RuntimeError(f"${CHECKSUMS_ENV} names no file of rlsdk's checksum algorithm")
    spec = importlib.util.spec_from_file_location(MODULE, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"${CHECKSUMS_ENV}={path!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def held_tensors(model: Any, tp_size: int) -> dict[str, Any]:
    """The model's parameters by vLLM's names, as the trainer's tensors compare with them."""
    padded = {
        f"{name}.weight": module.org_vocab_size
        for name, module in model.named_modules()
        if hasattr(module, "org_vocab_size") and hasattr(module, "num_embeddings_padded")
    }
    held = {}
    for name, parameter in model.named_parameters():
        tensor = parameter.data
        rows = padded.get(name)
        if rows is not None and tp_size == 1 and tensor.shape[0] > rows:
            tensor = tensor[:rows]
        held[name.replace(".base_layer.", ".")] = tensor
    return held


class WeightChecksums:
    """Mixed into vLLM's worker class: ``self`` is the worker."""

    def rlsdk_weight_checksums(self) -> dict[str, Any]:
        import torch
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        algorithm = _checksum_module()
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        tp_size = get_tensor_model_parallel_world_size()
        held = held_tensors(model, tp_size)
        with torch.inference_mode():
            sums = algorithm.tensor_checksums(list(held.values()))
        mapping = getattr(model, "packed_modules_mapping", None) or {}
        return {
            "checksums": dict(zip(held, sums, strict=True)),
            "fused": {f".{whole}.": [f".{part}." for part in parts] for whole, parts in mapping.items()},
            "tp_rank": get_tensor_model_parallel_rank(),
            "tp_size": tp_size,
        }
