"""PPO's critic: a value model (the policy's architecture without its output head, plus a linear value
head), its clipped value loss, and its own AdamW. The torch trainer builds one for ``advantage_estimator:
ppo``; its values feed GAE and it trains on GAE's returns, checkpointed in ``critic/`` beside the policy."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import CheckpointError
from .batch import SharedPrompts, TrainSample, micro_batches, slices
from .losses import sum_of_sample_mean_fn
from ..config import RolloutConfig
from .optim import adamw, load_tensors, optimizer_step

CRITIC_FOLDER = "critic"
CRITIC_WEIGHTS = "value_model.safetensors"
CRITIC_OPTIMIZER = "optimizer.pt"


class ValueModel(torch.nn.Module):
    """A transformer body and a linear head giving one value per position; the head starts at zero."""

    def __init__(self, body: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.body = body
        self.head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, layout: SharedPrompts, device: torch.device) -> torch.Tensor:
        """The value of the state before each response token of the layout's samples, in their order:
        ``[sum(response_lengths)]`` (read at the positions that predict those tokens)."""
        hidden = self.body(
            input_ids=layout.input_ids.to(device),
            position_ids=layout.position_ids.to(device),
            attention_mask=layout.attention_mask.to(device),
        ).last_hidden_state
        kept = hidden[:, layout.keep.to(device)].flatten(0, 1)
        return self.head(kept.index_select(0, layout.response_gather.to(device))).squeeze(-1).float()


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's value loss per token: ``0.5 * max((V - R)^2, (V_clipped - R)^2)`` with ``V_clipped`` the old
    value plus the change clipped to ``[-clip, clip]``; returns (loss, where the clipped term won)."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    plain, bounded = (values - returns).square(), (clipped - returns).square()
    return 0.5 * torch.maximum(plain, bounded), (bounded > plain).float()


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(R - V) / Var(R)`` over the masked tokens: 1 for a perfect critic, 0 for a constant one."""
    count = mask.sum().clamp_min(1)

    def variance(x: torch.Tensor) -> torch.Tensor:
        mean = (x * mask).sum() / count
        return ((x - mean).square() * mask).sum() / count

    total = variance(returns)
    return float(1 - variance(returns - values) / total) if total > 0 else 0.0


class Critic:
    """The value model of ``args.critic_load`` (default the policy's model) on ``device``, with AdamW at
    ``args.critic_lr`` (default ``lr``)."""

    def __init__(
        self, args: RolloutConfig, model_path: str, device: torch.device, dtype: torch.dtype, pad_id: int
    ) -> None:
        from transformers import AutoModel

        self.args, self.device, self.dtype, self.pad_id = args, device, dtype, pad_id
        body = AutoModel.from_pretrained(args.critic_load or model_path, dtype=dtype)
        model = ValueModel(body, body.config.hidden_size).to(dtype)
        self.model = torch.nn.Module.to(model, device)
        self.model.train()
        self.optimizer = adamw(self.model, args, lr=args.critic_lr if args.critic_lr is not None else args.lr)

    def _values(self, data: list[TrainSample], indices: list[int]) -> list[torch.Tensor]:
        layout = SharedPrompts.build(data, indices, self.dtype, self.pad_id)
        values = self.model(layout, self.device)
        return list(values.split([data[i].response_length for i in indices]))

    @torch.no_grad()
    def values(self, data: list[TrainSample]) -> list[torch.Tensor]:
        """Each sample's per-response-token values under the current critic (on CPU)."""
        out: list[torch.Tensor] = []
        for micro in micro_batches(data, self.args.micro_batch_size, self.args.max_tokens_per_gpu):
            out.extend(v.cpu() for v in self._values(data, micro))
        return out

    def train(
        self,
        data: list[TrainSample],
        old_values: list[torch.Tensor],
        returns: list[torch.Tensor],
        batch_size: int,
    ) -> dict[str, float]:
        """One pass over ``data`` in global batches of ``batch_size`` (one optimizer step each) on the clipped
        value loss against ``returns``; ``train/critic_*`` metrics (explained variance of the old values)."""
        args = self.args
        masks = [d.loss_mask for d in data]
        totals = {"value_loss": 0.0, "value_clipfrac": 0.0}
        norms = []
        for global_batch in slices(len(data), batch_size):
            part = list(range(global_batch.start, global_batch.stop))
            denominator = (
                sum(float(masks[i].sum()) for i in part)
                if args.calculate_per_token_loss
                else float(len(part))
            )
            for micro in micro_batches(
                [data[i] for i in part], args.micro_batch_size, args.max_tokens_per_gpu
            ):
                chosen = [part[i] for i in micro]
                values = torch.cat(self._values(data, chosen))
                chosen_masks = [masks[i].to(self.device) for i in chosen]
                reduce = sum_of_sample_mean_fn(
                    [data[i].response_length for i in chosen], chosen_masks, args.calculate_per_token_loss
                )
                loss, clipped = clipped_value_loss(
                    values,
                    torch.cat([old_values[i] for i in chosen]).to(self.device),
                    torch.cat([returns[i] for i in chosen]).to(self.device),
                    args.value_clip,
                )
                value_loss = reduce(loss)
                (value_loss / max(denominator, 1.0)).backward()
                totals["value_loss"] += float(value_loss.detach()) / max(denominator, 1.0)
                totals["value_clipfrac"] += float(reduce(clipped)) / max(denominator, 1.0)
            norms.append(optimizer_step(self.model, self.optimizer, args.clip_grad))
        steps = len(norms)
        metrics = {f"train/critic_{k}": v / steps for k, v in totals.items()}
        metrics["train/critic_grad_norm"] = sum(norms) / steps
        metrics["train/critic_explained_variance"] = explained_variance(
            torch.cat(old_values), torch.cat(returns), torch.cat(masks)
        )
        metrics["train/critic_values_mean"] = float(
            (torch.cat(old_values) * torch.cat(masks)).sum() / torch.cat(masks).sum().clamp_min(1)
        )
        return metrics

    def save(self, folder: Path) -> None:
        """The value model and its optimizer in ``folder/critic/``."""
        from safetensors.torch import save_model

        target = folder / CRITIC_FOLDER
        target.mkdir(parents=True, exist_ok=True)
        save_model(self.model, str(target / CRITIC_WEIGHTS))
        torch.save(self.optimizer.state_dict(), target / CRITIC_OPTIMIZER)

    def load(self, folder: Path) -> None:
        """Restore what :meth:`save` wrote; a checkpoint without a critic is an error."""
        from safetensors.torch import load_model

        source = folder / CRITIC_FOLDER
        if not (source / CRITIC_WEIGHTS).is_file():
            raise FileNotFoundError(
                f"checkpoint {folder} holds no critic ({CRITIC_FOLDER}/{CRITIC_WEIGHTS}): it was not saved by a "
                "run with advantage_estimator ppo"
            )
        load_model(self.model, str(source / CRITIC_WEIGHTS), device=str(self.device))
        state = load_tensors(source / CRITIC_OPTIMIZER, self.device)  # tensors only: no pickle runs
        try:
            self.optimizer.load_state_dict(state)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise CheckpointError(
                f"{source / CRITIC_OPTIMIZER} does not fit this run's critic ({type(exc).__name__}: {exc})"
            ) from None
