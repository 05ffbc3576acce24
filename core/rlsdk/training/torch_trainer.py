"""The ``torch`` trainer: a Hugging Face causal LM trained with AdamW on one device.

float32 on CPU (log-probs then match the embedded engine's to about 1e-5), bfloat16 on CUDA. A step's
samples are cut into global batches (one optimizer step each) and micro-batches (one forward and
backward pass each, gradients accumulated); the loss is slime's (or a ``loss`` plugin) on packed logits.
"""

from __future__ import annotations

import math
import os
import random
import resource
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..engines.lora_adapter import ADAPTER_WEIGHTS, lora_adapter_deltas
from ..engines.tokenizer_facts import tokenizer_fingerprint
from ..engines.weight_checksums import Layout, engine_checksums
from ..errors import CheckpointError, RlsdkError
from ..outputs import TRAIN_LOG_PROBS
from ..plugins.calls import call_advantage, call_reward_post_process, call_rollout_data_postprocess
from ..plugins.kinds import Loss
from ..plugins.records import Resolved
from ..runtime import plugins_of
from ..types import Sample
from .advantages import approx_kl, compute_advantages, normalize_rewards
from .batch import SharedPrompts, TrainSample, loss_batch, micro_batches, newest_version, slices
from .critic import Critic
from .distillation import subtract_reverse_kl
from .losses import log_probs_and_entropy, sum_of_sample_mean_fn
from .optim import adamw, load_tensors, optimizer_step
from .seeds import seed_everything
from .trainer import LoraAdapter, PolicyTrainer
from ..plugins.kinds import RewardPostProcess, RolloutDataPostprocess
from ..plugins.kinds import Advantage
from ..config import RolloutConfig

OPTIMIZER_FILE = "optimizer.pt"
RNG_FILE = "rng.pt"


class TorchTrainer(PolicyTrainer):
    """AdamW on a ``transformers`` causal LM; options from ``args`` (slime's names). With ``lora_rank`` the
    model is wrapped in a peft LoRA adapter and only the adapter trains; with ``advantage_estimator: ppo`` a
    :class:`~.critic.Critic` trains beside it."""

    critic: Critic | None = None
    lora: bool = False

    def __init__(self, args: RolloutConfig) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.args = args
        self.model_path = args.hf_checkpoint or args.model
        if not self.model_path:
            raise ValueError(
                "the torch trainer needs a Hugging Face model folder: pass --model or --hf-checkpoint"
            )
        device = args.train_device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        dtype = args.train_dtype
        if dtype == "auto":
            dtype = "bfloat16" if self.device.type == "cuda" else "float32"
        self.dtype = getattr(torch, dtype)
        if self.device.type == "cpu":
            torch.set_num_threads(args.train_threads or len(os.sched_getaffinity(0)))
        torch.manual_seed(args.rollout_seed)
        if args.sglang_enable_deterministic_inference:  # --deterministic, in whichever process trains
            seed_everything(args.rollout_seed)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.model = torch.nn.Module.to(
            AutoModelForCausalLM.from_pretrained(self.model_path, dtype=self.dtype), self.device
        )
        self.model.config.use_cache = False
        if args.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        if args.lora_rank:
            from .lora import wrap_with_lora

            if args.gradient_checkpointing:  # the frozen embeddings' outputs must carry gradients
                self.model.enable_input_require_grads()
            self.model = wrap_with_lora(self.model, args)
            self.lora = True
        self.model.train()
        self.optimizer = adamw(self.model, args)
        self.loss = resolve_loss(args)
        self._rollout_id = -1
        """The step being trained (named in errors and warnings)."""
        if args.advantage_estimator == "ppo":
            self.critic = Critic(
                args, self.model_path, self.device, self.dtype, self.tokenizer.pad_token_id or 0
            )
        self.ref_model = None
        if args.use_kl_loss or args.kl_coef:
            self.ref_model = self._frozen(args.ref_load or self.model_path)
        self.teacher_model = None
        if args.use_opd and args.opd_type == "megatron":  # slime's teacher loaded beside the policy
            self.teacher_model = self._frozen(args.opd_teacher_load)

    def _frozen(self, folder: Any) -> Any:
        """A model of ``folder`` on the trainer's device, in eval mode and without gradients."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=self.dtype)
        return torch.nn.Module.to(model, self.device).eval().requires_grad_(False)

    def tokenizer_info(self) -> dict[str, Any] | None:
        return tokenizer_fingerprint(self.tokenizer)

    # ------------------------------------------------------------------ training

    def train_step(self, rollout_id: int, groups: list[list[Sample]]) -> dict[str, float]:
        args = self.args
        started = time.perf_counter()
        self._rollout_id = rollout_id
        samples = [s for group in groups for s in group]
        if not samples:
            raise ValueError(f"step {rollout_id}: no samples to train on")
        raw, rewards = self._rewards(rollout_id, samples, groups)
        newest = newest_version(samples)
        data = [TrainSample.from_sample(s, r, newest) for s, r in zip(samples, rewards, strict=True)]
        masks = [d.loss_mask for d in data]
        gbs = args.global_batch_size or len(data)
        if args.num_steps_per_rollout:
            gbs = max(1, len(data) // args.num_steps_per_rollout)
        per_sample, kl = self._old_log_probs(data, one_optimizer_step=gbs >= len(data))
        if len(per_sample["log_probs"]) == len(samples):  # kept in rollouts.jsonl, for rlsdk view
            for sample, log_probs in zip(samples, per_sample["log_probs"], strict=True):
                sample.metadata[TRAIN_LOG_PROBS] = log_probs.tolist()
        postprocess_data = plugins_of(args).get(RolloutDataPostprocess)
        if postprocess_data is not None:
            rewards, masks = self._postprocess(rollout_id, postprocess_data, samples, data, raw, per_sample)
        values = self.critic.values(data) if self.critic is not None else None
        per_sample["advantages"], returns = self._advantages(rewards, kl, masks, data, per_sample, values)
        extra: dict[str, float] = {}
        if args.opd_teacher or args.use_opd:
            student = self._log_probs(self.model, data, temperature=1.0)
            if self.teacher_model is not None:
                teacher: list[Any] = self._log_probs(self.teacher_model, data, temperature=1.0)
            else:  # scored by the run's teacher engine, or (slime's sglang mode) by the reward post-process
                teacher = [s.teacher_log_probs for s in samples]
            per_sample["advantages"], extra["train/opd_reverse_kl"] = subtract_reverse_kl(
                per_sample["advantages"], student, teacher, masks, args.opd_kl_coef
            )
        if self.critic is not None:
            assert values is not None and returns is not None
            extra.update(self.critic.train(data, values, returns, gbs))
            if rollout_id < args.num_critic_only_steps:
                return {**extra, "train/samples": len(data), "train/seconds": time.perf_counter() - started}
        return {**self._optimize(rollout_id, samples, data, per_sample, gbs, started), **extra}

    def _rewards(
        self, rollout_id: int, samples: list[Sample], groups: list[list[Sample]]
    ) -> tuple[list[Any], list[float]]:
        """``(raw, rewards)``: each sample's reward, and what the trainer turns into advantages: the
        reward_post_process plugin's, else the group normalization's."""
        args = self.args
        post_process = plugins_of(args).get(RewardPostProcess)
        if post_process is not None:
            # reward_post_process: the plugin's rewards in place of the group normalization; it reads the
            # samples' rewards as they are (slime's on-policy distillation turns a dict into scalars there)
            return call_reward_post_process(post_process, args, samples)
        raw = [sample.get_reward_value(args) for sample in samples]
        if any(r is None for r in raw):
            raise ValueError(f"step {rollout_id}: a kept sample has no reward")
        return raw, normalize_rewards(
            args, [float(r) for r in raw if r is not None], [len(g) for g in groups]
        )

    def _old_log_probs(
        self, data: list[TrainSample], *, one_optimizer_step: bool
    ) -> tuple[dict[str, list[Any]], list[torch.Tensor]]:
        """The old policy's and the reference's log-probs (the current ones, detached, when the whole batch is
        one optimizer step) and the per-token KL between them."""
        args = self.args
        per_sample: dict[str, list[Any]] = {"log_probs": [], "ref_log_probs": []}
        if not args.use_rollout_logprobs and (not one_optimizer_step or args.kl_coef):
            per_sample["log_probs"] = self._log_probs(self.model, data)
        if self.ref_model is not None:
            per_sample["ref_log_probs"] = self._log_probs(self.ref_model, data)
        old = per_sample["log_probs"] or (
            [d.rollout_log_probs for d in data] if args.use_rollout_logprobs else []
        )
        if args.kl_coef and old:
            kl = [
                approx_kl(o, r, args.kl_loss_type)
                for o, r in zip(old, per_sample["ref_log_probs"], strict=True)
            ]
        else:
            kl = [torch.zeros(d.response_length) for d in data]
        return per_sample, kl

    def _optimize(
        self,
        rollout_id: int,
        samples: list[Sample],
        data: list[TrainSample],
        per_sample: dict[str, list[Any]],
        gbs: int,
        started: float,
    ) -> dict[str, float]:
        """One optimizer step per global batch of ``gbs`` samples; the step's training metrics."""
        args = self.args
        totals: dict[str, float] = {}
        grad_norms = []
        tokens = 0
        for step_id, global_batch in enumerate(slices(len(data), gbs)):
            self._before_train_step(rollout_id, step_id)
            indices = list(range(global_batch.start, global_batch.stop))
            part = [data[i] for i in indices]
            denominator = (
                sum(float(d.loss_mask.sum()) for d in part)
                if args.calculate_per_token_loss
                else float(len(part))
            )
            share = self._data_parallel_share(indices)
            batch_totals, batch_tokens = self._accumulate_gradients(
                samples, data, share, per_sample, max(denominator, 1.0)
            )
            for key, value in batch_totals.items():
                totals[key] = totals.get(key, 0.0) + value
            tokens += batch_tokens
            grad_norms.append(self._optimizer_step())
        totals, tokens = self._sum_over_data_parallel(totals, tokens)
        steps = len(grad_norms)
        finite = [norm for norm in grad_norms if math.isfinite(norm)]
        seconds = time.perf_counter() - started
        return {
            **{f"train/{k}": v / steps for k, v in totals.items()},
            "train/grad_norm": sum(finite) / len(finite) if finite else math.nan,
            "train/skipped_optimizer_steps": steps - len(finite),
            "train/optimizer_steps": steps,
            "train/samples": len(data),
            "train/seconds": seconds,
            "train/tokens_per_s": tokens / seconds if seconds else 0.0,
            "train/peak_memory_gb": peak_memory_gb(self.device),
            "train/lr": self.optimizer.param_groups[0]["lr"],
        }

    def _accumulate_gradients(
        self,
        samples: list[Sample],
        data: list[TrainSample],
        share: list[int],
        per_sample: dict[str, list[Any]],
        denominator: float,
    ) -> tuple[dict[str, float], int]:
        """The forward and backward passes over this process's ``share`` of a global batch (indices into
        ``data``), each micro-batch's loss divided by the global batch's ``denominator``; returns the loss
        metrics summed (each divided by the denominator) and the tokens seen."""
        totals: dict[str, float] = {}
        tokens = 0
        for micro in self._micro_batches([data[i] for i in share]):
            if not micro:  # a rank with fewer micro-batches than its peers (collective layers)
                self._empty_pass(backward=True)
                continue
            chosen = [share[i] for i in micro]
            if self.loss.record.logits == "response":
                logits = self._response_logits(self.model, data, chosen)
            else:
                logits = self._packed_logits(self.model, data, chosen)
            loss, metrics, count = self._micro_batch_loss(samples, data, chosen, per_sample, logits)
            (loss / denominator).backward()
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + value / denominator
            tokens += count
        return totals, tokens

    def _micro_batch_loss(
        self,
        samples: list[Sample],
        data: list[TrainSample],
        chosen: list[int],
        per_sample: dict[str, list[Any]],
        logits: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, float], int]:
        """The loss plugin's loss on a micro-batch's ``logits`` (checked), its metrics, its tokens."""
        batch = loss_batch(data, chosen, per_sample, self.device)
        reduce = sum_of_sample_mean_fn(
            batch["response_lengths"], batch["loss_masks"], self.args.calculate_per_token_loss
        )
        loss, metrics = self.loss.func(self.args, batch, logits, reduce)
        check_loss_value(self.loss, self._rollout_id, loss, [samples[i] for i in chosen])
        return loss, {k: float(v) for k, v in metrics.items()}, sum(batch["total_lengths"])

    def _advantages(
        self,
        rewards: list[float],
        kl: list[torch.Tensor],
        masks: list[torch.Tensor],
        data: list[TrainSample],
        per_sample: dict[str, list[Any]],
        values: list[torch.Tensor] | None = None,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """Per-token advantages, and with the critic's ``values`` the returns it trains on (GAE's
        advantages plus the values, before any whitening)."""
        args = self.args
        estimator = plugins_of(args).get(Advantage)
        if estimator is None:
            return compute_advantages(args, rewards, kl, masks, values)
        rollout_data: dict[str, Any] = {
            "rewards": rewards,
            "kl": kl,
            "loss_masks": masks,
            "response_lengths": [d.response_length for d in data],
            "total_lengths": [d.total_length for d in data],
            "rollout_log_probs": [d.rollout_log_probs for d in data],
            **per_sample,
        }
        if values is not None:
            rollout_data["values"] = values
        advantages = call_advantage(estimator, args, rollout_data)  # advantage
        if values is None:
            return advantages, None
        if "returns" not in rollout_data:
            raise ValueError(
                f"{estimator.describe()} did not set rollout_data['returns'] (the critic's targets, with "
                "advantage_estimator ppo)"
            )
        return advantages, list(rollout_data["returns"])

    def _postprocess(
        self,
        rollout_id: int,
        resolved: Resolved,
        samples: list[Sample],
        data: list[TrainSample],
        raw: list[Any],
        per_sample: dict[str, list[Any]],
    ) -> tuple[list[float], list[torch.Tensor]]:
        """rollout_data_postprocess: the plugin edits the step's data (once its log-probs are in); the rewards
        and loss masks it leaves are the ones trained on."""
        rollout_data: dict[str, Any] = {
            "tokens": [d.tokens for d in data],
            "response_lengths": [d.response_length for d in data],
            "total_lengths": [d.total_length for d in data],
            "rewards": [d.reward for d in data],
            "raw_reward": list(raw),
            "loss_masks": [d.loss_mask for d in data],
            "rollout_log_probs": [d.rollout_log_probs for d in data],
            "truncated": [int(s.status is Sample.Status.TRUNCATED) for s in samples],
            "sample_indices": [s.index for s in samples],
            **{k: v for k, v in per_sample.items() if v},
        }
        call_rollout_data_postprocess(resolved, self.args, rollout_id, rollout_data)
        for d, reward, mask in zip(data, rollout_data["rewards"], rollout_data["loss_masks"], strict=True):
            d.reward = float(reward)
            d.loss_mask = torch.as_tensor(mask, dtype=d.loss_mask.dtype)
        return [d.reward for d in data], [d.loss_mask for d in data]

    def _before_train_step(self, rollout_id: int, step_id: int) -> None:
        """Called before each optimizer step's passes (``step_id`` from 0 within the rollout step), gradients
        zeroed: nothing here; a subclass's hook (the megatron trainer's ``megatron_before_train_step``)."""

    def _micro_batches(self, samples: list[TrainSample]) -> list[list[int]]:
        """Indices into ``samples`` of each micro-batch; an empty one is a pass without samples, for a
        trainer whose ranks must run the same number of passes (:meth:`_empty_pass`)."""
        return micro_batches(samples, self.args.micro_batch_size, self.args.max_tokens_per_gpu)

    def _empty_pass(self, backward: bool) -> None:
        raise NotImplementedError(f"{type(self).__name__} plans no empty micro-batches")

    def _data_parallel_share(self, indices: list[int]) -> list[int]:
        """The samples of a global batch this process trains on: all of them (one process)."""
        return indices

    def _sum_over_data_parallel(self, totals: dict[str, float], tokens: int) -> tuple[dict[str, float], int]:
        """Loss metrics and token counts summed over the processes that shared the batches: these alone."""
        return totals, tokens

    def _optimizer_step(self) -> float:
        """Apply the gradients (:func:`~.optim.optimizer_step`: a non-finite norm skips the update with a
        warning, T6); a loss no weight's gradient depends on is an error naming the loss plugin."""
        if not any(p.grad is not None for p in self.model.parameters()):
            raise RlsdkError(
                f"step {self._rollout_id}: {self.loss.describe()} gave a loss that no weight's gradient "
                "depends on (nothing to train): a loss must be computed from the logits it is given"
            )
        return optimizer_step(
            self.model,
            self.optimizer,
            self.args.clip_grad,
            context=f"step {self._rollout_id}, {self.loss.describe()}",
        )

    def _packed_logits(self, model: Any, data: list[TrainSample], indices: list[int]) -> torch.Tensor:
        """``[1, sum(total_lengths), vocab]``: the micro-batch's logits in slime's packed layout, computed
        with each distinct prompt once (:class:`~.batch.SharedPrompts`)."""
        layout = SharedPrompts.build(data, indices, self.dtype, self.tokenizer.pad_token_id or 0)
        logits = self._forward(model, layout)
        return logits.flatten(0, 1).index_select(0, layout.gather.to(self.device)).unsqueeze(0)

    def _response_logits(self, model: Any, data: list[TrainSample], indices: list[int]) -> torch.Tensor:
        """``[1, sum(response_lengths), vocab]``: the logits of the positions that predict the micro-batch's
        response tokens, in the samples' order (what a ``response`` loss reads); the vocabulary projection
        runs at those positions only (``logits_to_keep``)."""
        layout = SharedPrompts.build(data, indices, self.dtype, self.tokenizer.pad_token_id or 0)
        logits = self._forward(model, layout, logits_to_keep=layout.keep.to(self.device))
        return logits.flatten(0, 1).index_select(0, layout.response_gather.to(self.device)).unsqueeze(0)

    def _forward(self, model: Any, layout: SharedPrompts, **options: Any) -> torch.Tensor:
        return model(
            input_ids=layout.input_ids.to(self.device),
            position_ids=layout.position_ids.to(self.device),
            attention_mask=layout.attention_mask.to(self.device),
            **options,
        ).logits

    @torch.no_grad()
    def _log_probs(
        self, model: Any, data: list[TrainSample], temperature: float | None = None
    ) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for micro in self._micro_batches(data):
            if not micro:
                self._empty_pass(backward=False)
                continue
            out.extend(
                self._micro_batch_log_probs(
                    data, micro, self._response_logits(model, data, micro), temperature
                )
            )
        return out

    def _micro_batch_log_probs(
        self, data: list[TrainSample], micro: list[int], logits: torch.Tensor, temperature: float | None
    ) -> list[torch.Tensor]:
        """Each sample's response log-probs (float32, on the CPU) from a micro-batch's response logits."""
        batch = loss_batch(data, micro, {}, self.device)
        log_probs, _ = log_probs_and_entropy(
            logits, batch, self.args, with_entropy=False, temperature=temperature
        )
        return [lp.float().cpu() for lp in log_probs]

    def response_log_probs(self, samples: list[Sample]) -> list[list[float]]:
        data = [TrainSample.from_sample(s, 0.0) for s in samples]
        return [lp.tolist() for lp in self._log_probs(self.model, data, temperature=1.0)]

    # ------------------------------------------------------------------ colocated memory

    def offload(self) -> None:
        """The optimizer's state to CPU memory (gradients are already freed after each optimizer step).
        On CUDA into page-locked buffers kept from one offload to the next: a copy to pageable memory ran
        at about 1.6 GB/s (16 GB of Qwen3-4B's AdamW state in 7-14 s on an H100)."""
        if self.device.type != "cuda":
            return
        buffers = self.__dict__.setdefault("_host_state", {})
        for param, state in self.optimizer.state.items():
            for key, value in state.items():
                # AdamW's fused step counter stays with its parameter's device, as the optimizer made it
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.is_cuda:
                    host = buffers.get((id(param), key))
                    if host is None or host.shape != value.shape or host.dtype != value.dtype:
                        host = buffers[(id(param), key)] = torch.empty_like(
                            value, device="cpu", pin_memory=True
                        )
                    state[key] = host.copy_(value, non_blocking=True)
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()

    def onload(self) -> None:
        """The optimizer's state back on the GPU (the page-locked buffers stay for the next offload)."""
        if self.device.type != "cuda":
            return
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and not value.is_cuda:
                    state[key] = value.to(self.device, non_blocking=True)
        torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------------ weights and checkpoints

    def weights(self) -> Mapping[str, Any]:
        """The policy's state dict; with LoRA the base model's names with the adapter merged in."""
        if not self.lora:
            return self.model.state_dict()
        peft_model: Any = self.model
        base = {
            name.replace(".base_layer.", "."): tensor
            for name, tensor in peft_model.get_base_model().state_dict().items()
            if ".lora_" not in name
        }
        adapter = self.lora_adapter()
        assert adapter is not None
        deltas = lora_adapter_deltas(adapter.config, adapter.tensors, base)
        return {name: t + deltas[name].to(t.dtype) if name in deltas else t for name, t in base.items()}

    def weight_checksums(self, layout: Layout) -> dict[str, tuple[list[str], list[str]]]:
        """From the model's own parameters (not through :meth:`weights`), with torch's grad mode off."""
        if self.lora:
            return super().weight_checksums(layout)
        with torch.no_grad():
            return engine_checksums(self.model.state_dict(), layout)

    def lora_adapter(self) -> LoraAdapter | None:
        if not self.lora:
            return None
        from .lora import adapter_config, adapter_tensors

        return LoraAdapter(adapter_config(self.model), adapter_tensors(self.model))

    def save_lora_adapter(self, folder: Path) -> None:
        if not self.lora:
            super().save_lora_adapter(folder)
        from .lora import save_adapter

        save_adapter(self.model, folder)

    def save_hf_model(self, folder: Path) -> None:
        if self.lora:  # the base model with the adapter merged in
            peft_model: Any = self.model
            peft_model.get_base_model().save_pretrained(folder, state_dict=dict(self.weights()))
        else:
            self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)

    def save_checkpoint(self, folder: Path) -> None:
        """The model (with LoRA the adapter alone), the tokenizer, optimizer and random states, the critic."""
        if self.lora:
            self.save_lora_adapter(folder)
            self.tokenizer.save_pretrained(folder)
        else:
            self.save_hf_model(folder)
        self._save_optimizer_and_rng(folder)
        if self.critic is not None:
            self.critic.save(folder)

    def load_checkpoint(self, folder: Path) -> None:
        from safetensors.torch import load_model

        weights = folder / (ADAPTER_WEIGHTS if self.lora else "model.safetensors")
        try:
            if self.lora:
                from .lora import load_adapter

                load_adapter(self.model, folder)
            else:
                load_model(self.model, str(weights), device=str(self.device))
        except CheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001 -- a missing, cut or foreign file: name it
            raise CheckpointError(f"{weights} cannot be loaded ({type(exc).__name__}: {exc})") from None
        self._load_optimizer_and_rng(folder)
        if self.critic is not None:
            self.critic.load(folder)

    def _save_optimizer_and_rng(self, folder: Path) -> None:
        torch.save(self.optimizer.state_dict(), folder / OPTIMIZER_FILE)
        torch.save(
            {
                "torch": torch.get_rng_state(),
                "python": random.getstate(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            },
            folder / RNG_FILE,
        )

    def _load_optimizer_and_rng(self, folder: Path) -> None:
        optimizer = load_tensors(folder / OPTIMIZER_FILE, self.device)
        rng = load_tensors(folder / RNG_FILE, "cpu")
        try:
            self.optimizer.load_state_dict(optimizer)
            torch.set_rng_state(rng["torch"])
            random.setstate(rng["python"])
            if rng["cuda"] is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(rng["cuda"])
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise CheckpointError(
                f"{folder / OPTIMIZER_FILE} or {folder / RNG_FILE} does not fit this run "
                f"({type(exc).__name__}: {exc})"
            ) from None


def check_loss_value(loss: Resolved[Loss], rollout_id: int, value: Any, samples: list[Sample]) -> None:
    """A loss that is not a finite tensor with a gradient stops the step naming the loss plugin and the
    samples (T4, T5): a NaN would reach the weights and be blamed on the engine by the trust check."""
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise RlsdkError(
            f"step {rollout_id}: {loss.describe()} returned {type(value).__name__}, not a scalar tensor"
        )
    if not value.requires_grad:
        raise RlsdkError(
            f"step {rollout_id}: {loss.describe()} returned a loss without gradients (computed from detached "
            "tensors or constants): nothing to train"
        )
    if not torch.isfinite(value.detach()).item():
        where = ", ".join(f"{s.group_index}/{s.index}" for s in samples[:4])
        raise RlsdkError(
            f"step {rollout_id}: {loss.describe()} gave a non-finite loss ({value.item()}) on the samples "
            f"{where}{' ...' if len(samples) > 4 else ''} (group/index): the step stops before it reaches the "
            "weights; check the rewards, the advantages and the loss"
        )


def resolve_loss(args: RolloutConfig) -> Resolved[Loss]:
    """``loss_type``'s loss: a built-in by name, or ``custom_loss_function_path`` (a loss plugin or path)."""
    loss = plugins_of(args).get(Loss)
    assert loss is not None, "a training run names its loss"
    return loss


def peak_memory_gb(device: torch.device) -> float:
    """Peak resident memory of this process (CPU) or peak allocated GPU memory, in GB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 1e9 if sys.platform == "darwin" else rss / 1e6
