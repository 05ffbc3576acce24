"""Rewards to advantages, with slime's estimators and meanings (``--advantage-estimator``).

Everything works on lists with one entry per sample: scalar rewards, and per-response-token tensors
(KL, loss masks, advantages) of each sample's response length.
"""

from __future__ import annotations


import torch
from ..config import RolloutConfig

GROUP_NORMALIZED = ("grpo", "gspo", "cispo", "sapo", "rloo", "reinforce_plus_plus_baseline")
STD_NORMALIZED = ("grpo", "gspo", "cispo", "sapo")
SEQUENCE_REWARD = (*STD_NORMALIZED, "rloo", "reinforce")
"""Estimators that give every token of a sample its (normalized) reward as advantage."""


def normalize_rewards(args: RolloutConfig, rewards: list[float], group_sizes: list[int]) -> list[float]:
    """slime's reward post-processing: for the group estimators (unless ``disable_rewards_normalization``)
    subtract each group's mean; for grpo/gspo/cispo/sapo also divide by the group's (unbiased) standard
    deviation plus 1e-6 (unless ``disable_grpo_std_normalization``). Groups may differ in size.

    ``rloo`` (REINFORCE leave-one-out: Kool et al. 2019, "Buy 4 REINFORCE samples, get a baseline for
    free!"; Ahmadian et al. 2024, "Back to Basics") subtracts the mean of the group's *other* rewards:
    ``r_i - mean_{j != i} r_j = k / (k - 1) * (r_i - mean)`` for a group of k; a lone sample gets 0.
    ``reinforce`` (Williams 1992) and ``ppo`` keep the raw rewards."""
    if args.advantage_estimator not in GROUP_NORMALIZED or args.disable_rewards_normalization:
        return list(rewards)
    if sum(group_sizes) != len(rewards):
        raise ValueError(f"{len(rewards)} rewards for groups of sizes {group_sizes}")
    out: list[float] = []
    start = 0
    for size in group_sizes:
        group = torch.tensor(rewards[start : start + size], dtype=torch.float32)
        start += size
        centered = group - group.mean()
        if args.advantage_estimator == "rloo":
            centered = centered * (size / (size - 1)) if size > 1 else torch.zeros_like(centered)
        if args.advantage_estimator in STD_NORMALIZED and not args.disable_grpo_std_normalization:
            std = group.std() if size > 1 else torch.zeros(())  # a lone sample: advantage 0
            centered = centered / (std + 1e-6)
        out.extend(centered.tolist())
    return out


def approx_kl(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    kl_type: str,
    importance_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL estimate of the policy against the reference (Schulman's k1, k2, k3)."""
    log_ratio = log_probs.float() - ref_log_probs.float()
    if kl_type == "k1":
        kl = log_ratio
    elif kl_type == "k2":
        kl = log_ratio.square() / 2
    elif kl_type in ("k3", "low_var_kl"):
        kl = torch.expm1(-log_ratio) + log_ratio
    else:
        raise ValueError(f"unknown kl_loss_type {kl_type!r}: choose k1, k2, k3 or low_var_kl")
    if importance_ratio is not None:
        kl = importance_ratio * kl
    if kl_type == "low_var_kl":
        kl = kl.clamp(-10, 10)
    return kl


def discounted_returns(token_rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1} along one response (GAE with no values and lambda 1)."""
    return gae(token_rewards, torch.zeros_like(token_rewards), gamma, 1.0)


def token_rewards(reward: float, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """``-kl_coef * kl`` on the trained tokens, plus the reward on the last trained token."""
    if not mask.any():
        raise ValueError("a sample has no trained token to put its reward on")
    out = -kl_coef * kl * mask
    out[mask.nonzero()[-1, 0]] += reward
    return out


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lambd: float) -> torch.Tensor:
    """Generalized advantage estimation (Schulman et al. 2016) along one response: with
    ``delta_t = r_t + gamma * V_{t+1} - V_t`` (``V`` after the last token is 0),
    ``A_t = delta_t + gamma * lambd * A_{t+1}``."""
    advantages = torch.empty_like(rewards)
    running = torch.zeros((), dtype=rewards.dtype)
    next_value = torch.zeros((), dtype=rewards.dtype)
    for t in range(rewards.numel() - 1, -1, -1):
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lambd * running
        advantages[t] = running
        next_value = values[t]
    return advantages


def compute_advantages(
    args: RolloutConfig,
    rewards: list[float],
    kl: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    values: list[torch.Tensor] | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Per-token advantages from (normalized) rewards and per-token KL to the reference, whitened over the
    batch's trained tokens with ``normalize_advantages``; with the critic's ``values``, also the returns it
    trains on (the advantages plus ``values``, before any whitening).

    - grpo, gspo, cispo, sapo, rloo, reinforce: every token of a sample gets its (normalized) reward;
    - ppo: GAE (``gamma``, ``lambd``) over the critic's ``values`` and the token rewards of
      reinforce_plus_plus (below); the critic's targets are these advantages plus ``values``;
    - reinforce_plus_plus: token rewards are ``-kl_coef * kl`` on trained tokens plus the reward on the
      last trained token, discounted by ``gamma`` into returns;
    - reinforce_plus_plus_baseline: the (group-centered) reward minus ``kl_coef * kl`` on every token.
    """
    estimator = args.advantage_estimator
    if estimator in SEQUENCE_REWARD:
        advantages = [torch.full_like(k, float(r)) for r, k in zip(rewards, kl, strict=True)]
    elif estimator == "ppo":
        if values is None:
            raise ValueError("advantage_estimator ppo needs the critic's values")
        advantages = [
            gae(token_rewards(r, k, m, args.kl_coef), v, args.gamma, args.lambd)
            for r, k, m, v in zip(rewards, kl, loss_masks, values, strict=True)
        ]
    elif estimator == "reinforce_plus_plus":
        advantages = [
            discounted_returns(token_rewards(r, k, m, args.kl_coef), args.gamma)
            for r, k, m in zip(rewards, kl, loss_masks, strict=True)
        ]
    elif estimator == "reinforce_plus_plus_baseline":
        advantages = [
            torch.full_like(k, float(r)) - args.kl_coef * k for r, k in zip(rewards, kl, strict=True)
        ]
    else:
        raise ValueError(f"unknown advantage_estimator {estimator!r}")
    returns = None if values is None else [a + v for a, v in zip(advantages, values, strict=True)]
    return (whiten(advantages, loss_masks) if args.normalize_advantages else advantages), returns


def whiten(advantages: list[torch.Tensor], loss_masks: list[torch.Tensor]) -> list[torch.Tensor]:
    """Zero mean, unit variance over the masked tokens of every sample together; masked tokens keep 0."""
    values, masks = torch.cat(advantages), torch.cat(loss_masks).to(torch.float32)
    count = masks.sum().clamp_min(1)
    mean = (values * masks).sum() / count
    var = ((values - mean).square() * masks).sum() / count
    whitened = (values - mean) * torch.rsqrt(var + 1e-8) * masks
    return list(whitened.split([a.numel() for a in advantages]))
