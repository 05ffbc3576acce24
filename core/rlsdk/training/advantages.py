"""Rewards to advantages, with slime's estimators and meanings (``--advantage-estimator``).

Everything works on lists with one entry per sample: scalar rewards, and per-response-token tensors
(KL, loss masks, advantages) of each sample's response length.
"""

from __future__ import annotations

from typing import Any

import torch

GROUP_NORMALIZED = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
STD_NORMALIZED = ("grpo", "gspo", "cispo")


def normalize_rewards(args: Any, rewards: list[float], group_sizes: list[int]) -> list[float]:
    """slime's reward post-processing: for the group estimators (unless ``disable_rewards_normalization``)
    subtract each group's mean; for grpo/gspo/cispo also divide by the group's (unbiased) standard
    deviation plus 1e-6 (unless ``disable_grpo_std_normalization``). Groups may differ in size."""
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
    """G_t = r_t + gamma * G_{t+1} along one response."""
    returns = torch.empty_like(token_rewards)
    running = torch.zeros((), dtype=token_rewards.dtype)
    for t in range(token_rewards.numel() - 1, -1, -1):
        running = token_rewards[t] + gamma * running
        returns[t] = running
    return returns


def compute_advantages(
    args: Any, rewards: list[float], kl: list[torch.Tensor], loss_masks: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Per-token advantages from (normalized) rewards and per-token KL to the reference.

    - grpo, gspo, cispo: every token of a sample gets its reward;
    - reinforce_plus_plus: token rewards are ``-kl_coef * kl`` on trained tokens plus the reward on the
      last trained token, discounted by ``gamma`` into returns;
    - reinforce_plus_plus_baseline: the (group-centered) reward minus ``kl_coef * kl`` on every token.
    ``normalize_advantages`` then whitens them over the trained tokens of the batch.
    """
    estimator = args.advantage_estimator
    if estimator in STD_NORMALIZED:
        advantages = [torch.full_like(k, float(r)) for r, k in zip(rewards, kl, strict=True)]
    elif estimator == "reinforce_plus_plus":
        advantages = []
        for reward, k, mask in zip(rewards, kl, loss_masks, strict=True):
            if not mask.any():
                raise ValueError("reinforce_plus_plus: a sample has no trained token")
            token_rewards = -args.kl_coef * k * mask
            token_rewards[mask.nonzero()[-1, 0]] += reward
            advantages.append(discounted_returns(token_rewards, args.gamma))
    elif estimator == "reinforce_plus_plus_baseline":
        advantages = [
            torch.full_like(k, float(r)) - args.kl_coef * k for r, k in zip(rewards, kl, strict=True)
        ]
    else:
        raise ValueError(f"unknown advantage_estimator {estimator!r}")
    if args.normalize_advantages:
        advantages = whiten(advantages, loss_masks)
    return advantages


def whiten(advantages: list[torch.Tensor], loss_masks: list[torch.Tensor]) -> list[torch.Tensor]:
    """Zero mean, unit variance over the masked tokens of every sample together; masked tokens keep 0."""
    values, masks = torch.cat(advantages), torch.cat(loss_masks).to(torch.float32)
    count = masks.sum().clamp_min(1)
    mean = (values * masks).sum() / count
    var = ((values - mean).square() * masks).sum() / count
    whitened = (values - mean) * torch.rsqrt(var + 1e-8) * masks
    return list(whitened.split([a.numel() for a in advantages]))
