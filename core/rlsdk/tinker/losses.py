"""Tinker's built-in losses (``forward_backward``'s ``loss_fn``), with Tinker's semantics rather than slime's:
each is a **sum** over a datum's tokens, weighted by the caller's per-token ``weights`` or ``advantages``, with
no normalization by length or batch, so that the chunks the SDK splits a batch into add up to the batch's
gradient. ``target_logprobs`` are the learner's log-probs of ``target_tokens``; ``logprobs`` are the sampler's.

- ``cross_entropy``: ``-(target_logprobs * weights).sum()`` (signed weights: ``forward_backward_custom``
  sends ``-dC/dlogprobs`` as weights; no ``weights`` means all ones)
- ``importance_sampling``: ``-(exp(target_logprobs - logprobs) * advantages).sum()``
- ``ppo``: the ratio clipped to ``[clip_low_threshold, clip_high_threshold]`` (``loss_fn_config``, default
  0.8 and 1.2, or per token in ``loss_fn_inputs``), the minimum of the clipped and unclipped objectives
- ``cispo``: the clipped ratio, detached, times ``target_logprobs * advantages``
- ``dro``: ``-(target_logprobs * advantages - beta / 2 * (target_logprobs - logprobs) ** 2).sum()``
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .wire import Datum, WireError

Tensor = Any  # torch.Tensor; torch loads with the trainer


def _ratio(lp: Tensor, inputs: Mapping[str, Tensor]) -> Tensor:
    import torch

    return torch.exp(lp - inputs["logprobs"])


def cross_entropy(lp: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    return -(lp * inputs["weights"]).sum()


def importance_sampling(lp: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    return -(_ratio(lp, inputs) * inputs["advantages"]).sum()


def _clipped(ratio: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    """The ratio clipped to the thresholds: per token where ``loss_fn_inputs`` give them, else the config's."""
    import torch

    low = inputs.get("clip_low_threshold", config["clip_low_threshold"])
    high = inputs.get("clip_high_threshold", config["clip_high_threshold"])
    bounds = {"dtype": ratio.dtype, "device": ratio.device}
    return torch.clamp(ratio, torch.as_tensor(low, **bounds), torch.as_tensor(high, **bounds))


def ppo(lp: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    import torch

    ratio, advantages = _ratio(lp, inputs), inputs["advantages"]
    clipped = _clipped(ratio, inputs, config)
    return -torch.minimum(ratio * advantages, clipped * advantages).sum()


def cispo(lp: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    clipped = _clipped(_ratio(lp, inputs), inputs, config)
    return -(clipped.detach() * lp * inputs["advantages"]).sum()


def dro(lp: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    penalty = (lp - inputs["logprobs"]) ** 2
    return -(lp * inputs["advantages"] - 0.5 * config["beta"] * penalty).sum()


@dataclass(frozen=True)
class Loss:
    """A built-in loss: the float ``loss_fn_inputs`` it needs besides ``target_tokens``, its
    ``loss_fn_config`` keys with their defaults (None: required), the function, and the float inputs it
    reads when given (per-token clip thresholds)."""

    inputs: tuple[str, ...]
    config: Mapping[str, float | None]
    fn: Callable[[Tensor, Mapping[str, Tensor], Mapping[str, float]], Tensor]
    optional: tuple[str, ...] = ()

    @property
    def reads(self) -> tuple[str, ...]:
        return self.inputs + self.optional


_CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
LOSSES: dict[str, Loss] = {
    "cross_entropy": Loss(("weights",), {}, cross_entropy),
    "importance_sampling": Loss(("logprobs", "advantages"), {}, importance_sampling),
    "ppo": Loss(("logprobs", "advantages"), _CLIP, ppo, tuple(_CLIP)),
    "cispo": Loss(("logprobs", "advantages"), _CLIP, cispo, tuple(_CLIP)),
    "dro": Loss(("logprobs", "advantages"), {"beta": None}, dro),
}


def check_loss(name: str, config: Mapping[str, float | str], data: list[Datum]) -> dict[str, float]:
    """The loss's config with its defaults filled in, after checking ``name``, the config and every datum's
    ``loss_fn_inputs`` (names, lengths equal to the datum's tokens); a problem is a :class:`WireError`."""
    loss = LOSSES.get(name)
    if loss is None:
        raise WireError(f"loss_fn: {name!r} is not supported here; choose one of {', '.join(LOSSES)}")
    unknown = sorted(set(config) - set(loss.config))
    if unknown:
        allowed = ", ".join(loss.config) or "none"
        raise WireError(f"loss_fn_config: {unknown} not understood by {name} (it takes: {allowed})")
    resolved: dict[str, float] = {}
    for key, default in loss.config.items():
        value = config.get(key, default)
        if value is None:
            raise WireError(f"loss_fn_config: {name} needs {key!r}")
        if isinstance(value, str) or not np.isfinite(value):
            raise WireError(f"loss_fn_config[{key!r}]: a finite number, got {value!r}")
        resolved[key] = float(value)
    for i, datum in enumerate(data):
        needed = {"target_tokens", *loss.inputs} - ({"weights"} if name == "cross_entropy" else set())
        missing = sorted(needed - set(datum.inputs))
        if missing:
            raise WireError(f"data[{i}].loss_fn_inputs: {name} needs {missing}")
        for key, array in datum.inputs.items():
            if key in {"target_tokens", *loss.reads} and len(array) != len(datum.tokens):
                raise WireError(
                    f"data[{i}].loss_fn_inputs[{key!r}]: {len(array)} values for {len(datum.tokens)} "
                    "model_input tokens"
                )
            if key != "target_tokens" and array.dtype.kind == "f" and not np.all(np.isfinite(array)):
                raise WireError(f"data[{i}].loss_fn_inputs[{key!r}]: holds a NaN or infinity")
        if datum.inputs["target_tokens"].dtype.kind not in "iu":
            raise WireError(f"data[{i}].loss_fn_inputs['target_tokens']: token ids must be integers")
    return resolved
