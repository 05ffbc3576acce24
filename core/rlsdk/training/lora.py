"""LoRA for the torch trainer, through peft: the policy wrapped with an adapter (``lora_rank``,
``lora_alpha``, ``lora_target_modules``), only the adapter trained; what the weight sync hands an engine
(the adapter's PEFT config and tensors, or its folder), and merging a saved adapter into its base model.

An adapter travels in PEFT's own format, the one SGLang's ``/load_lora_adapter`` reads: a folder with
``adapter_config.json`` and ``adapter_model.safetensors`` whose keys end in ``lora_A.weight`` /
``lora_B.weight``; in process, the same config (a dict) and tensors."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..engines.lora_adapter import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from ..config import RolloutConfig
from ..errors import CheckpointError


def wrap_with_lora(model: Any, args: RolloutConfig) -> Any:
    """``model`` with a fresh LoRA adapter (dropout 0, so that trainer and engine compute the same function);
    every other parameter frozen."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=args.lora_rank,
        lora_alpha=args.lora_alpha if args.lora_alpha is not None else 2 * args.lora_rank,  # type: ignore[arg-type]
        target_modules=list(args.lora_target_modules) if args.lora_target_modules else "all-linear",
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def adapter_tensors(model: Any) -> dict[str, torch.Tensor]:
    """The adapter's tensors under PEFT's saved names (``...q_proj.lora_A.weight``); never the frozen base
    weights peft would add for an adapted output head tied to the embeddings."""
    from peft import get_peft_model_state_dict

    return dict(get_peft_model_state_dict(model, save_embedding_layers=False))


def adapter_config(model: Any) -> dict[str, Any]:
    """The adapter's PEFT config as JSON data (what ``adapter_config.json`` holds)."""
    config = model.peft_config["default"].to_dict()
    return json.loads(json.dumps(config, default=lambda v: sorted(v) if isinstance(v, set) else str(v)))


def save_adapter(model: Any, folder: Path) -> None:
    """``adapter_config.json`` and ``adapter_model.safetensors`` in ``folder`` (nothing of the base model)."""
    model.save_pretrained(folder, save_embedding_layers=False)


def load_adapter(model: Any, folder: Path) -> None:
    """Set the adapter of the wrapped ``model`` to the one saved in ``folder``."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    path = folder / ADAPTER_WEIGHTS
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {folder} holds no LoRA adapter ({ADAPTER_WEIGHTS})")
    tensors = load_file(str(path))
    missing = sorted(set(adapter_tensors(model)) - set(tensors))
    if missing:  # PEFT would leave those at their fresh values without a word
        raise CheckpointError(
            f"{path} misses {len(missing)} of the model's adapter tensors ({', '.join(missing[:3])}"
            f"{' ...' if len(missing) > 3 else ''}): it is cut or another run's adapter"
        )
    result = set_peft_model_state_dict(model, tensors)
    unexpected = list(getattr(result, "unexpected_keys", None) or [])
    if unexpected:
        raise CheckpointError(f"{path} does not fit the model: unexpected tensors {unexpected[:5]}")


def merge_adapter(adapter_folder: Path, base_folder: Path, output: Path) -> None:
    """Write ``base_folder``'s model with the adapter of ``adapter_folder`` merged into its weights, as a
    plain Hugging Face model folder (config, safetensors, tokenizer) in ``output``."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (adapter_folder / ADAPTER_CONFIG).is_file():
        raise FileNotFoundError(f"{adapter_folder} holds no LoRA adapter ({ADAPTER_CONFIG})")
    if not (base_folder / "config.json").is_file():
        raise FileNotFoundError(f"{base_folder} is not a Hugging Face model folder (no config.json)")
    base = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, adapter_folder).merge_and_unload()
    merged.save_pretrained(output)
    AutoTokenizer.from_pretrained(base_folder).save_pretrained(output)


def tensors_on_cpu(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached CPU copies (what an engine in this process keeps after the trainer steps on)."""
    return {name: t.detach().to("cpu", copy=True) for name, t in tensors.items()}
