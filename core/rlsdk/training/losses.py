"""slime's losses on packed logits: the clipped policy gradient (PPO, GSPO, CISPO, dual clip, TIS,
entropy and KL terms) and the SFT loss, plus the helpers a custom loss needs.

A loss gets one micro-batch: ``batch`` (lists with one entry per sample: ``unconcat_tokens``,
``total_lengths``, ``response_lengths``, ``loss_masks``, ``advantages``, ``log_probs``,
``rollout_log_probs``, ``ref_log_probs``), the packed ``logits`` ``[1, sum(total_lengths), vocab]``
and ``sum_of_sample_mean``; it returns ``(loss, metrics)``. Losses are summed over the samples of the
micro-batch; the trainer divides by the samples (or tokens) of the global batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..plugins.calls import call_pg_loss_reducer, call_tis_function
from ..runtime import plugins_of
from ..training_options import tis_on
from .advantages import approx_kl
from .batch import response_rows
from ..plugins.kinds import PgLossReducer, TisFunction
from ..config import RolloutConfig

Reducer = Callable[[torch.Tensor], torch.Tensor]


LOGPROB_GAP_THRESHOLD = 1.0
"""Nats: a sampled token whose engine and trainer log-probs differ by more counts in
``train/rollout_tokens_over_gap`` (the share of such tokens)."""


def sum_of_sample_mean_fn(
    response_lengths: list[int],
    loss_masks: list[torch.Tensor],
    per_token: bool = False,
    denominators: list[torch.Tensor] | None = None,
) -> Reducer:
    """A reducer of packed per-response-token values: the sum over samples of each sample's masked mean,
    or with ``per_token`` the masked sum over every token. ``denominators`` (default ``loss_masks``) are the
    masks whose sums divide: a TIS function's rejected tokens leave the mean's denominator as it was."""
    divisors = denominators if denominators is not None else loss_masks

    def reduce(x: torch.Tensor) -> torch.Tensor:
        total = x.new_zeros(())
        for part, mask, divisor in zip(x.split(response_lengths), loss_masks, divisors, strict=True):
            masked = (part * mask).sum()
            total = total + (masked if per_token else masked / divisor.sum().clamp_min(1))
        return total

    return reduce


def response_logits(logits: torch.Tensor, batch: dict[str, Any], temperature: float = 1.0) -> torch.Tensor:
    """The rows of ``logits`` that predict each sample's response tokens, divided by the sampling
    temperature (as the engine's log-probs are): ``[sum(response_lengths), vocab]``. ``logits`` is either
    packed (``[1, sum(total_lengths), vocab]``) or already those rows (a ``response`` loss's; every sample
    has a prompt token, so the two shapes never coincide)."""
    rows = logits.squeeze(0)
    if rows.shape[0] != sum(batch["response_lengths"]):
        rows = rows.index_select(
            0, response_rows(batch["total_lengths"], batch["response_lengths"]).to(rows.device)
        )
    out = rows.float()
    return out / temperature if temperature not in (0, 1) else out


def log_probs_and_entropy(
    logits: torch.Tensor,
    batch: dict[str, Any],
    args: RolloutConfig,
    with_entropy: bool = True,
    entropy_grad: bool = True,
    temperature: float | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Per-sample log-probs of the response tokens (and entropies of the predicting distributions;
    without ``entropy_grad`` they are computed outside autograd, a metric only), at ``temperature``
    (default the sampling temperature ``args.rollout_temperature``)."""
    if temperature is None:
        temperature = getattr(args, "rollout_temperature", 1.0) or 1.0
    rows = response_logits(logits, batch, temperature)
    targets = torch.cat(
        [
            tokens[total - response :]
            for tokens, total, response in zip(
                batch["unconcat_tokens"], batch["total_lengths"], batch["response_lengths"], strict=True
            )
        ]
    )
    normalizer = torch.logsumexp(rows, dim=-1)
    log_probs = rows.gather(-1, targets.to(rows.device).unsqueeze(-1)).squeeze(-1) - normalizer
    lengths = list(batch["response_lengths"])
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = list((normalizer - (torch.softmax(rows, dim=-1) * rows).sum(-1)).split(lengths))
    return list(log_probs.split(lengths)), entropy


def clipped_policy_loss(
    ppo_kl: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token (with dual clip when ``eps_clip_c``); returns (loss, clipped)."""
    ratio = torch.exp(-ppo_kl)
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1 - eps_clip, 1 + eps_clip_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    clip_fraction = (clipped > unclipped).float()
    if eps_clip_c is not None:
        if eps_clip_c <= 1:
            raise ValueError(f"eps_clip_c must be above 1 for dual-clip PPO, got {eps_clip_c}")
        loss = torch.where(advantages < 0, torch.minimum(-eps_clip_c * advantages, loss), loss)
    return loss, clip_fraction


def cispo_loss(
    ppo_kl: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO: the ratio clipped under stop-gradient weights ``-advantage * log_prob``."""
    ratio = torch.exp(-ppo_kl)
    truncated = ratio.clamp(1 - eps_clip, 1 + eps_clip_high)
    return -truncated.detach() * advantages * log_probs, (truncated != ratio).float()


def importance_weighted_loss(ppo_kl: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """REINFORCE's score-function loss (Williams 1992, "Simple statistical gradient-following algorithms
    for connectionist reinforcement learning"), as ``reinforce`` and ``rloo`` use it: ``-ratio * advantage``
    with no clipping; on the samples' own policy (ratio 1) its gradient is ``-advantage * grad log_prob``."""
    return -torch.exp(-ppo_kl) * advantages


def soft_gated_loss(
    ppo_kl: torch.Tensor, advantages: torch.Tensor, tau_pos: float, tau_neg: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """SAPO's loss per token (Gao et al. 2025, "Soft Adaptive Policy Optimization", arXiv:2511.20347):
    ``-f(ratio) * advantage`` with the soft gate ``f(r) = sigmoid(tau * (r - 1)) * 4 / tau`` in place of
    PPO's hard clip, ``tau`` being ``tau_pos`` for a positive advantage and ``tau_neg`` otherwise. The
    gradient's weight ``4 * s * (1 - s)`` (``s`` the sigmoid) is 1 on policy and decays smoothly as the
    ratio moves away. Returns (loss, the tokens whose weight fell below one half: the "clipped" ones)."""
    ratio = torch.exp(-ppo_kl)
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1))
    weight = 4 * gate * (1 - gate)
    return -(gate * 4 / tau) * advantages, (weight < 0.5).float()


def sequence_kl(old: list[torch.Tensor], new: list[torch.Tensor], masks: list[torch.Tensor]) -> torch.Tensor:
    """GSPO: each sample's masked mean of (old - new) log-probs, repeated over its tokens."""
    return torch.cat(
        [
            (((o - n) * m).sum() / m.sum().clamp_min(1)).expand_as(n)
            for o, n, m in zip(old, new, masks, strict=True)
        ]
    )


def policy_loss(
    args: RolloutConfig, batch: dict[str, Any], logits: torch.Tensor, sum_of_sample_mean: Reducer
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """slime's ``policy_loss``: clipped policy gradient minus ``entropy_coef`` times entropy plus
    ``kl_loss_coef`` times the KL to the reference, with TIS against the rollout log-probs. The policy
    gradient term follows ``advantage_estimator``: PPO's clip (grpo, ppo, reinforce_plus_plus*), GSPO's
    sequence ratio, CISPO, SAPO's soft gate, or REINFORCE's unclipped one (reinforce, rloo)."""
    log_prob_list, entropy_list = log_probs_and_entropy(
        logits, batch, args, with_entropy=True, entropy_grad=bool(args.entropy_coef)
    )
    assert entropy_list is not None
    old_list = batch["rollout_log_probs"] if args.use_rollout_logprobs else batch.get("log_probs")
    if not old_list:
        old_list = [lp.detach() for lp in log_prob_list]
    log_probs, old = torch.cat(log_prob_list), torch.cat(old_list)
    ppo_kl = (
        sequence_kl(old_list, log_prob_list, batch["loss_masks"])
        if args.advantage_estimator == "gspo"
        else old - log_probs
    )
    pg_loss, clip_fraction = policy_gradient(args, ppo_kl, log_probs, torch.cat(batch["advantages"]))
    train_old = batch.get("log_probs") or [lp.detach() for lp in log_prob_list]
    pg_loss, pg_masks, sum_of_sample_mean, metrics = truncated_importance(
        args, batch, pg_loss, train_old, sum_of_sample_mean
    )
    pg_reduce = sum_of_sample_mean
    reducer = plugins_of(args).get(PgLossReducer)
    if reducer is not None:
        # pg_loss_reducer: the plugin's reduction of the policy-gradient term only
        pg_reduce = call_pg_loss_reducer(
            reducer,
            batch["total_lengths"],
            batch["response_lengths"],
            pg_masks,
            args.calculate_per_token_loss,
        )
    pg = pg_reduce(pg_loss)
    entropy = sum_of_sample_mean(torch.cat(entropy_list))
    loss = pg - args.entropy_coef * entropy
    metrics.update(
        pg_loss=pg.detach(),
        entropy_loss=entropy.detach(),
        pg_clipfrac=sum_of_sample_mean(clip_fraction).detach(),
        ppo_kl=sum_of_sample_mean(ppo_kl).detach(),
    )
    if args.use_kl_loss:
        kl = approx_kl(log_probs, torch.cat(batch["ref_log_probs"]), args.kl_loss_type)
        kl_loss = sum_of_sample_mean(kl)
        loss = loss + args.kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss.detach()
    if batch.get("rollout_log_probs"):
        metrics.update(sampler_gap(args, batch, log_probs, old, sum_of_sample_mean))
    metrics["loss"] = loss.detach()
    return loss, metrics


def sampler_gap(
    args: RolloutConfig,
    batch: dict[str, Any],
    log_probs: torch.Tensor,
    old: torch.Tensor,
    sum_of_sample_mean: Reducer,
) -> dict[str, torch.Tensor]:
    """The sampler against the trainer on the sampled tokens of the samples the trainer's weights sampled
    (``current_policy``; one continued after a weight sync differs by design), as sums the session divides
    by ``rollout_gap_judged`` (those samples' share): the mean absolute gap, the sampled-token estimate of
    KL(sampler || trainer), the share of tokens past :data:`LOGPROB_GAP_THRESHOLD`."""
    compared = log_probs if args.use_rollout_logprobs else old
    rollout = batch["rollout_log_probs"]
    gap = torch.cat(rollout) - compared.detach()
    current = batch.get("current_policy") or [True] * len(rollout)
    judged = torch.cat([torch.full_like(r, float(c)) for r, c in zip(rollout, current, strict=True)])
    return {
        "train_rollout_logprob_abs_diff": sum_of_sample_mean(gap.abs() * judged),
        "rollout_kl": sum_of_sample_mean(gap * judged),
        "rollout_tokens_over_gap": sum_of_sample_mean(
            (gap.abs() > LOGPROB_GAP_THRESHOLD).to(gap.dtype) * judged
        ),
        "rollout_gap_judged": sum_of_sample_mean(judged),
    }


def policy_gradient(
    args: RolloutConfig, ppo_kl: torch.Tensor, log_probs: torch.Tensor, advantages: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-token policy-gradient loss of ``advantage_estimator`` and where it clipped."""
    eps_high = args.eps_clip if args.eps_clip_high is None else args.eps_clip_high
    if args.advantage_estimator == "cispo":
        return cispo_loss(ppo_kl, log_probs, advantages, args.eps_clip, eps_high)
    if args.advantage_estimator == "sapo":
        return soft_gated_loss(ppo_kl, advantages, args.sapo_tau_pos, args.sapo_tau_neg)
    if args.advantage_estimator in ("reinforce", "rloo"):
        return importance_weighted_loss(ppo_kl, advantages), torch.zeros_like(ppo_kl)
    return clipped_policy_loss(ppo_kl, advantages, args.eps_clip, eps_high, args.eps_clip_c)


def truncated_importance(
    args: RolloutConfig,
    batch: dict[str, Any],
    pg_loss: torch.Tensor,
    train_old: list[torch.Tensor],
    sum_of_sample_mean: Reducer,
) -> tuple[torch.Tensor, list[Any], Reducer, dict[str, torch.Tensor]]:
    """TIS where it is on (by default where rollout log-probs are): the tis_function plugin's weights (or
    rejections) of the per-token loss, else the clipped ratio of the trainer's to the engine's log-probs.
    ``(pg_loss, loss masks to reduce it with, the reducer, metrics)``."""
    metrics: dict[str, torch.Tensor] = {}
    if not (tis_on(args) and bool(args.use_tis or batch.get("rollout_log_probs"))):
        return pg_loss, batch["loss_masks"], sum_of_sample_mean, metrics
    tis_function = plugins_of(args).get(TisFunction)
    if tis_function is None:
        tis = torch.exp(torch.cat(train_old) - torch.cat(batch["rollout_log_probs"]))
        weights = tis.clamp(args.tis_clip_low, args.tis_clip)
        metrics["tis"] = sum_of_sample_mean(tis).detach()
        metrics["tis_clipfrac"] = sum_of_sample_mean((weights != tis).float()).detach()
        return pg_loss * weights, batch["loss_masks"], sum_of_sample_mean, metrics
    # tis_function: the plugin weights (or rejects) the per-token loss, called by keyword as slime does
    pg_loss, pg_masks, tis_metrics = call_tis_function(
        tis_function,
        args=args,
        pg_loss=pg_loss,
        train_log_probs=train_old,
        rollout_log_probs=batch["rollout_log_probs"],
        loss_masks=batch["loss_masks"],
        total_lengths=batch["total_lengths"],
        response_lengths=batch["response_lengths"],
    )
    reduce = sum_of_sample_mean_fn(
        batch["response_lengths"], pg_masks, args.calculate_per_token_loss, denominators=batch["loss_masks"]
    )
    for key, value in tis_metrics.items():
        value = torch.as_tensor(value)
        metrics[key] = (reduce(value) if value.shape == pg_loss.shape else value).detach()
    return pg_loss, pg_masks, reduce, metrics


def sft_loss(
    args: RolloutConfig, batch: dict[str, Any], logits: torch.Tensor, sum_of_sample_mean: Reducer
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """slime's ``sft_loss``: the negative log-likelihood of the trained response tokens."""
    log_prob_list, _ = log_probs_and_entropy(logits, batch, args, with_entropy=False)
    loss = -sum_of_sample_mean(torch.cat(log_prob_list))
    return loss, {"loss": loss.detach()}
