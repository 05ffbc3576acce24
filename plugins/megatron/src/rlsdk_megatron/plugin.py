"""Registers the ``megatron`` trainer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlsdk import Trainer, hookimpl

RANK_TRAINER = "rlsdk_megatron.trainer:MegatronTrainer"


def megatron_trainer(args: Any) -> Any:
    """megatron-core GPTModel (Llama, Qwen2, Qwen3, Qwen3-MoE) in bfloat16 on CUDA, one process per GPU, TP, PP, DP and EP from slime's flags."""
    from rlsdk.trainer_api import trainer_world_size

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


def check_megatron_settings(args: Any) -> None:
    """The parallel sizes, checked against the model's config when its folder is named (before any engine
    starts: a size SmolLM2's 9 heads cannot take fails at once, not after SGLang's start)."""
    from rlsdk.trainer_api import named_model_folder, trainer_world_size

    from .trainer import check_parallel_sizes

    folder = named_model_folder(args)
    named = folder / "config.json" if folder else None
    config = json.loads(named.read_text()) if named and named.is_file() else None
    check_parallel_sizes(args, trainer_world_size(args), config)


@hookimpl
def rlsdk_trainers() -> Any:
    yield Trainer(name="megatron", func=megatron_trainer, check=check_megatron_settings)
