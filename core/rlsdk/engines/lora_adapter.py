"""LoRA adapters as engines take them: PEFT's folder format (what SGLang's ``/load_lora_adapter`` reads) and
the weight change each adapted linear layer makes, for an engine that merges an adapter into its weights."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_PARTS = (".lora_A.weight", ".lora_B.weight")


def read_lora_adapter(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The PEFT config and tensors of the adapter folder ``folder`` (its two files, nothing else)."""
    from safetensors.torch import load_file

    config_file, weights_file = folder / ADAPTER_CONFIG, folder / ADAPTER_WEIGHTS
    if not config_file.is_file() or not weights_file.is_file():
        raise FileNotFoundError(
            f"{folder} is not a PEFT adapter folder ({ADAPTER_CONFIG}, {ADAPTER_WEIGHTS})"
        )
    try:
        config = json.loads(config_file.read_text())
    except ValueError as exc:
        raise ValueError(f"{config_file} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_file} must hold a JSON object")
    return config, load_file(str(weights_file))


def lora_adapter_deltas(
    config: Mapping[str, Any], tensors: Mapping[str, Any], weights: Mapping[str, Any]
) -> dict[str, Any]:
    """``weight name -> scale * B @ A`` for every linear layer the adapter adapts, checked against the
    model's ``weights`` (names and shapes); ``scale`` is ``lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA).
    Adapters this cannot merge exactly (DoRA, per-layer ranks, bias or embedding adapters) are refused."""
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"not a LoRA adapter: peft_type {config.get('peft_type')!r}")
    for feature in ("use_dora", "fan_in_fan_out"):
        if config.get(feature):
            raise ValueError(f"LoRA adapters with {feature} are not supported")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValueError("LoRA adapters with per-layer ranks (rank_pattern, alpha_pattern) are not supported")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, int | float):
        raise ValueError(
            f"adapter config needs a positive integer r and a number lora_alpha, got {rank!r}, {alpha!r}"
        )
    scale = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    pairs: dict[str, dict[str, Any]] = {}
    for key, tensor in tensors.items():
        part = next((p for p in _PARTS if key.endswith(p)), None)
        if part is None:
            raise ValueError(f"adapter tensor {key!r} is not a linear layer's lora_A or lora_B")
        module = key.removeprefix(_PREFIX)[: -len(part)]
        pairs.setdefault(module, {})[part] = tensor
    deltas = {}
    for module, pair in pairs.items():
        name = f"{module}.weight"
        if len(pair) != 2 or name not in weights:
            raise ValueError(
                f"adapter layer {module!r} does not fit the model (needs lora_A and lora_B of {name})"
            )
        a, b = pair[_PARTS[0]], pair[_PARTS[1]]
        weight = weights[name]
        if a.shape[0] != b.shape[1] or (b.shape[0], a.shape[1]) != tuple(weight.shape):
            raise ValueError(
                f"adapter layer {module!r}: B {tuple(b.shape)} @ A {tuple(a.shape)} does not fit {name} "
                f"{tuple(weight.shape)}"
            )
        deltas[name] = (b.float() @ a.float()) * scale
    if not deltas:
        raise ValueError("the adapter has no tensors")
    return deltas
