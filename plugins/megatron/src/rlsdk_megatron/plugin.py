"""Registers the ``megatron`` trainer."""

from __future__ import annotations

from typing import Any

from rlsdk import Trainer, hookimpl


def megatron_trainer(args: Any) -> Any:
    """megatron-core GPTModel (Llama, Qwen2) in bfloat16 on CUDA, TP/PP/DP from slime's flags."""
    from .trainer import MegatronTrainer

    return MegatronTrainer(args)


@hookimpl
def rlsdk_trainers() -> Any:
    yield Trainer(name="megatron", func=megatron_trainer)
