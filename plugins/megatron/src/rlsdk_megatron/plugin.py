"""Registers the ``megatron`` trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlsdk import Trainer, hookimpl

RANK_TRAINER = "rlsdk_megatron.trainer:MegatronTrainer"


def megatron_trainer(args: Any) -> Any:
    """megatron-core GPTModel (Llama, Qwen2) in bfloat16 on CUDA, one process per GPU, TP and DP from slime's flags."""
    from rlsdk.training.options import trainer_world_size

    from .trainer import MegatronTrainer, cuda_device

    world_size = trainer_world_size(args)
    if world_size == 1:
        return MegatronTrainer(args)
    import torch

    cuda_device()  # refuses a machine without CUDA before any rank starts
    if world_size > torch.cuda.device_count():
        raise ValueError(
            f"rlsdk-megatron: {world_size} trainer GPUs asked for (actor_num_gpus_per_node), "
            f"{torch.cuda.device_count()} visible"
        )
    from .rank_group import RankGroupTrainer

    return RankGroupTrainer(RANK_TRAINER, args, world_size, Path(args.output_dir) / "logs")


@hookimpl
def rlsdk_trainers() -> Any:
    yield Trainer(name="megatron", func=megatron_trainer)
