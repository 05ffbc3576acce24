"""One Tinker training model on rlsdk's torch trainer: ``forward_backward`` accumulates gradients (Tinker's
summed losses, :mod:`.losses`) until ``optim_step`` applies them with the step's ``AdamParams`` (torch's
AdamW, as Tinker's is); LoRA through peft with Tinker's rank and ``train_mlp``/``train_attn``/
``train_unembed`` flags (``lora_alpha`` 32, as Tinker's), or every weight when no LoRA is asked for.

All methods block (they run torch) and are called one at a time, in the model's ``seq_id`` order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import RolloutConfig
from ..training.lora import load_adapter, tensors_on_cpu
from ..training.optim import optimizer_step
from ..training.sync import check_tolerance
from ..training.torch_trainer import TorchTrainer
from ..training.trainer import LoraAdapter
from ..types import Sample
from .futures import UserError
from .losses import LOSSES
from .wire import Datum

LORA_ALPHA = 32
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
UNEMBED = ("lm_head",)
MAX_TOKENS_PER_PASS = 8192
"""Padded tokens one forward pass takes at most; a chunk of more is run in several passes (gradients add)."""
PROBE_TOKENS = 32
"""Response tokens of the trust check's probe (the end of the last datum trained on)."""


@dataclass(frozen=True)
class LoraSpec:
    """Tinker's ``LoraConfig``."""

    rank: int
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True

    def targets(self) -> list[str]:
        return [
            *(ATTENTION if self.train_attn else ()),
            *(MLP if self.train_mlp else ()),
            *(UNEMBED if self.train_unembed else ()),
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "seed": self.seed,
            "train_mlp": self.train_mlp,
            "train_attn": self.train_attn,
            "train_unembed": self.train_unembed,
        }


@dataclass(frozen=True)
class Placement:
    """Where the trainer runs: ``device`` and ``dtype`` as the torch trainer reads them (``auto``: CUDA in
    bfloat16 when there is one, else the CPU in float32), its CPU threads, and the trust check's tolerance
    (None: the trainer's default for its device)."""

    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None
    check_tolerance: float | None = None


class TrainingRun:
    """A model being trained: the torch trainer's model and AdamW, and the last datum trained on (the trust
    check's probe)."""

    def __init__(self, model_folder: Path, lora: LoraSpec | None, placement: Placement) -> None:
        if lora is not None and lora.rank < 1:
            raise UserError(f"lora_config.rank must be at least 1, got {lora.rank}")
        if lora is not None and not lora.targets():
            raise UserError("at least one of train_mlp, train_attn and train_unembed must be true")
        settings: dict[str, Any] = {
            "model": str(model_folder),
            "train_device": placement.device,
            "train_dtype": placement.dtype,
            "train_threads": placement.threads,
            "rollout_seed": lora.seed if lora is not None and lora.seed is not None else _random_seed(),
            "clip_grad": 0.0,
            "sync_check_tol": placement.check_tolerance,
        }
        if lora is not None:
            settings.update(lora_rank=lora.rank, lora_alpha=LORA_ALPHA, lora_target_modules=lora.targets())
        self.lora = lora
        self.args = RolloutConfig.from_dict(settings)
        try:
            self.trainer = TorchTrainer(self.args)
        except ValueError as exc:  # peft: a target module the architecture does not have
            raise UserError(f"cannot set up LoRA on {model_folder.name}: {exc}") from None
        self.model: Any = self.trainer.model
        self.vocab_size = int(self.model.config.vocab_size)
        self.tolerance = check_tolerance(self.args, self.trainer)
        self.probe: Sample = self._default_probe()

    # ------------------------------------------------------------------ training

    def forward_backward(
        self, data: Sequence[Datum], loss_fn: str, config: dict[str, float], backward: bool
    ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Every datum's learner log-probs of its ``target_tokens``; the loss summed over them, its gradient
        added to the weights' (``backward``)."""
        for i, datum in enumerate(data):
            for name, ids in (
                ("model_input", datum.tokens),
                ("target_tokens", datum.inputs["target_tokens"]),
            ):
                if ids.min() < 0 or ids.max() >= self.vocab_size:
                    raise UserError(f"data[{i}].{name}: token ids must lie in [0, {self.vocab_size})")
        loss = LOSSES[loss_fn]
        outputs: list[dict[str, np.ndarray]] = []
        total = 0.0
        self.model.train(backward)
        for batch in _passes(data):
            with torch.set_grad_enabled(backward):
                logprobs, lengths = self._target_logprobs([data[i] for i in batch])
                losses = []
                for row, i in enumerate(batch):
                    inputs = {
                        name: torch.as_tensor(array, device=logprobs.device)
                        for name, array in data[i].inputs.items()
                        if name in loss.reads
                    }
                    if loss_fn == "cross_entropy" and "weights" not in inputs:
                        inputs["weights"] = torch.ones(lengths[row], device=logprobs.device)
                    losses.append(loss.fn(logprobs[row, : lengths[row]], inputs, config))
                batch_loss = torch.stack(losses).sum()
                if backward and batch_loss.requires_grad:
                    batch_loss.backward()
            total += float(batch_loss.detach())
            for row in range(len(batch)):
                outputs.append({"logprobs": logprobs[row, : lengths[row]].detach().float().cpu().numpy()})
        if backward:
            last = data[-1]
            self.probe = _probe(last.tokens) or self.probe
        return outputs, {"loss:sum": total}

    def _target_logprobs(self, data: Sequence[Datum]) -> tuple[torch.Tensor, list[int]]:
        """``[rows, longest]`` log-probs of each datum's targets (right-padded), and each datum's length."""
        device = self.trainer.device
        lengths = [len(d.tokens) for d in data]
        longest = max(lengths)
        ids = torch.zeros((len(data), longest), dtype=torch.long)
        targets = torch.zeros((len(data), longest), dtype=torch.long)
        mask = torch.zeros((len(data), longest), dtype=torch.long)
        for row, datum in enumerate(data):
            n = lengths[row]
            ids[row, :n] = torch.from_numpy(datum.tokens)
            targets[row, :n] = torch.from_numpy(datum.inputs["target_tokens"])
            mask[row, :n] = 1
        logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
        picked = logits.gather(-1, targets.to(device)[..., None])[..., 0]
        return picked - torch.logsumexp(logits, dim=-1), lengths

    def optim_step(self, params: Any) -> dict[str, float]:
        """One AdamW step with Tinker's ``AdamParams`` (learning rate, betas, eps, decoupled weight decay,
        global gradient-norm clipping; 0 clips nothing); the gradients are cleared."""
        for group in self.trainer.optimizer.param_groups:
            group["lr"] = params.learning_rate
            group["betas"] = (params.beta1, params.beta2)
            group["eps"] = params.eps
            group["weight_decay"] = params.weight_decay
        norm = optimizer_step(self.model, self.trainer.optimizer, params.grad_clip_norm, context="optim_step")
        return {"grad_norm:mean": norm, "learning_rate:mean": params.learning_rate}

    # ------------------------------------------------------------------ state and weights

    def save_state(self, folder: Path) -> None:
        """Weights (the adapter alone with LoRA), tokenizer, optimizer and random states."""
        self.trainer.save_checkpoint(folder)

    def load_state(self, folder: Path, optimizer: bool) -> None:
        """The weights of a :meth:`save_state` folder, and its optimizer and random states if ``optimizer``."""
        if optimizer:
            self.trainer.load_checkpoint(folder)
            return
        if self.lora is not None:
            load_adapter(self.model, folder)
            return
        from safetensors.torch import load_model

        load_model(self.model, str(folder / "model.safetensors"), device=str(self.trainer.device))

    def sampler_weights(self) -> LoraAdapter | dict[str, torch.Tensor]:
        """A copy of what an engine needs to serve the current weights: the adapter, or every weight."""
        adapter = self.trainer.lora_adapter()
        if adapter is not None:
            return LoraAdapter(adapter.config, tensors_on_cpu(adapter.tensors))
        return tensors_on_cpu(dict(self.trainer.weights()))

    def save_sampler(self, folder: Path) -> None:
        """The weights for sampling: a PEFT adapter folder with LoRA, else a Hugging Face model folder."""
        if self.lora is not None:
            self.trainer.save_lora_adapter(folder)
            self.trainer.tokenizer.save_pretrained(folder)
        else:
            self.trainer.save_hf_model(folder)

    def save_merged(self, folder: Path) -> None:
        """A plain Hugging Face model folder with any adapter merged in (``save_weights_external``)."""
        self.trainer.save_hf_model(folder)

    def _default_probe(self) -> Sample:
        ids = self.trainer.tokenizer("The engine and the trainer must agree on every token of this probe.")
        return _probe(np.asarray(ids["input_ids"], dtype=np.int64)) or Sample(
            tokens=[0, 0], response_length=1
        )

    def close(self) -> None:
        self.trainer.close()


def _probe(tokens: np.ndarray) -> Sample | None:
    if len(tokens) < 2:
        return None
    return Sample(tokens=tokens.tolist(), response_length=min(PROBE_TOKENS, len(tokens) - 1))


def _passes(data: Sequence[Datum]) -> list[list[int]]:
    """Indices of the datums each forward pass takes: in order, at most :data:`MAX_TOKENS_PER_PASS` padded
    tokens a pass (a longer datum alone)."""
    passes: list[list[int]] = []
    longest = 0
    for i, datum in enumerate(data):
        n = len(datum.tokens)
        if passes and max(longest, n) * (len(passes[-1]) + 1) <= MAX_TOKENS_PER_PASS:
            passes[-1].append(i)
            longest = max(longest, n)
        else:
            passes.append([i])
            longest = n
    return passes


def _random_seed() -> int:
    import secrets

    return secrets.randbelow(2**31)
