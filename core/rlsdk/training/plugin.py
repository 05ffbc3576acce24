"""Core's training plugins: the ``torch`` trainer and slime's ``policy_loss`` and ``sft_loss``."""

from __future__ import annotations

from typing import Any

from ..plugins.hookspecs import hookimpl
from ..plugins.kinds import (
    Loss,
    MegatronBeforeLogProb,
    MegatronBeforeTrainStep,
    MegatronInit,
    ModelProvider,
    Trainer,
)
from ..config import RolloutConfig


MEGATRON_HOOK_OPTIONS = tuple(
    record.options[0].name
    for record in (MegatronInit, MegatronBeforeLogProb, MegatronBeforeTrainStep, ModelProvider)
)
"""slime's megatron hooks: the ``megatron`` trainer calls them, the ``torch`` trainer has no megatron model."""


def check_torch_settings(args: RolloutConfig) -> None:
    """Refuse the megatron hooks: with the torch trainer they would never run."""
    named = [
        f"--{option.replace('_', '-')}" for option in MEGATRON_HOOK_OPTIONS if getattr(args, option, None)
    ]
    if named:
        raise ValueError(
            f"{', '.join(named)}: megatron hooks, which only --trainer megatron calls; the torch trainer would "
            "never run them"
        )


def torch_trainer(args: RolloutConfig) -> Any:
    """AdamW on a Hugging Face causal LM (float32 on CPU, bfloat16 on CUDA)."""
    from .torch_trainer import TorchTrainer

    return TorchTrainer(args)


def policy_loss(args: RolloutConfig, batch: Any, logits: Any, sum_of_sample_mean: Any) -> Any:
    """slime's clipped policy gradient (PPO/GSPO/CISPO, TIS, entropy and KL terms)."""
    from .losses import policy_loss as loss

    return loss(args, batch, logits, sum_of_sample_mean)


def sft_loss(args: RolloutConfig, batch: Any, logits: Any, sum_of_sample_mean: Any) -> Any:
    """Negative log-likelihood of the trained response tokens."""
    from .losses import sft_loss as loss

    return loss(args, batch, logits, sum_of_sample_mean)


@hookimpl
def rlsdk_trainers() -> Any:
    yield Trainer(name="torch", func=torch_trainer, check=check_torch_settings)


@hookimpl
def rlsdk_losses() -> Any:
    yield Loss(name="policy_loss", func=policy_loss, logits="response")
    yield Loss(name="sft_loss", func=sft_loss, logits="response")
