"""The trainers' optimizer: fused AdamW over the trainable parameters, one clipped step, and its saved
state loaded back without unpickling code."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import torch
from ..config import RolloutConfig

from ..errors import CheckpointError


def adamw(model: torch.nn.Module, args: RolloutConfig, lr: float | None = None) -> torch.optim.AdamW:
    """AdamW over ``model``'s trainable parameters with slime's options (``lr`` unless given, ``weight_decay``,
    ``adam_*``), in its fused form: one pass over each parameter (a step over SmolLM2-135M's parameters on
    2 CPU cores took an eighth of the default implementation's time)."""
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=args.lr if lr is None else lr,
        weight_decay=args.weight_decay,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_eps,
        fused=True,
    )


def optimizer_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    clip_grad: float,
    *,
    context: str = "a train step",
) -> float:
    """Clip the gradient norm to ``clip_grad`` (0: no clipping), step, clear the gradients; the norm before.
    A non-finite norm (an overflow) skips the step with a RuntimeWarning naming ``context``: clipping would
    scale every gradient to 0 (or NaN) and change nothing, silently (T6)."""
    total = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    norm = float(total)
    if not math.isfinite(norm):
        warnings.warn(
            f"{context}: the gradient norm is {norm} (an overflow in the loss or its advantages): this "
            "optimizer step is skipped, the weights are unchanged",
            RuntimeWarning,
            stacklevel=2,
        )
    else:
        if clip_grad and clip_grad > 0:
            torch.nn.utils.clip_grads_with_norm_(model.parameters(), clip_grad, total)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


def load_tensors(path: Path, device: Any) -> Any:
    """A ``torch.save`` file of tensors and plain values, loaded with ``weights_only=True``: a pickle that
    would run code (a checkpoint file replaced by an attacker's) is refused, never executed (T14). A
    missing or damaged file is a :class:`CheckpointError` naming it."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:  # noqa: BLE001 -- UnpicklingError, cut files, foreign formats: name the file
        raise CheckpointError(
            f"{path} cannot be loaded safely ({type(exc).__name__}: {str(exc)[:300]}); a checkpoint holds "
            "only tensors and plain values: resume from another checkpoint or start afresh"
        ) from None
