"""reinforce, rloo, sapo and ppo's GAE against values worked out by hand on small tensors."""

from __future__ import annotations

import math

import pytest
import torch

from rlsdk import RolloutConfig
from rlsdk.training.advantages import compute_advantages, gae, normalize_rewards
from rlsdk.training.losses import importance_weighted_loss, policy_loss, soft_gated_loss, sum_of_sample_mean_fn


def args(**options):
    return RolloutConfig(**options)


def close(a, b, tol=1e-5):
    return len(a) == len(b) and all(abs(x - y) < tol for x, y in zip(a, b, strict=True))


def test_rloo_subtracts_the_mean_of_the_other_rewards():
    # group [1, 0, 0, 1]: each 1 sees others' mean 1/3 -> 2/3; each 0 sees 2/3 -> -2/3. Group [5, 2]: 3, -3.
    # A lone sample has no other to compare with: 0.
    out = normalize_rewards(args(advantage_estimator="rloo"), [1, 0, 0, 1, 5, 2, 7], [4, 2, 1])
    assert close(out, [2 / 3, -2 / 3, -2 / 3, 2 / 3, 3.0, -3.0, 0.0])
    per_token, _ = compute_advantages(args(advantage_estimator="rloo"), out[:2], [torch.zeros(3), torch.zeros(1)],
                                      [torch.ones(3), torch.ones(1)])
    assert close(per_token[0].tolist(), [2 / 3] * 3) and close(per_token[1].tolist(), [-2 / 3])


def test_reinforce_keeps_raw_rewards_and_sapo_normalizes_like_grpo():
    rewards = [1.0, 0.0, 0.0, 0.0]
    assert normalize_rewards(args(advantage_estimator="reinforce"), rewards, [4]) == rewards
    assert normalize_rewards(args(advantage_estimator="ppo"), rewards, [4]) == rewards
    z = 0.75 / 0.5  # centered 0.75, unbiased std of [1, 0, 0, 0] = 0.5
    assert close(normalize_rewards(args(advantage_estimator="sapo"), rewards, [4]), [z, -z / 3, -z / 3, -z / 3],
                 tol=1e-4)


def test_reinforce_loss_is_unclipped_and_its_gradient_is_minus_advantage_times_score():
    log_probs = torch.tensor([-1.0, -2.0], requires_grad=True)
    old = torch.tensor([-1.0 - math.log(2.0), -2.0])  # ratios 2 and 1: PPO would clip the first
    loss = importance_weighted_loss(old - log_probs, torch.tensor([1.0, -3.0]))
    assert close(loss.tolist(), [-2.0, 3.0])
    loss.sum().backward()
    assert close(log_probs.grad.tolist(), [-2.0, 3.0])  # -A * ratio * d log p


def test_sapo_soft_gate_by_hand():
    # ratio 1: gate sigmoid(0) = 1/2, loss -(1/2 * 4 / tau) * A, gradient weight 4 * 1/4 = 1.
    # ratio e (log-ratio 1), A = 2 > 0, tau_pos 1: s = sigmoid(e - 1), loss -4 s * 2, weight 4 s (1 - s).
    # ratio 1, A = -1, tau_neg 2: loss -(1/2 * 4 / 2) * -1 = 1.
    log_probs = torch.tensor([0.0, 1.0, 0.0], requires_grad=True)
    advantages = torch.tensor([1.0, 2.0, -1.0])
    loss, low_weight = soft_gated_loss(torch.zeros(3) - log_probs, advantages, tau_pos=1.0, tau_neg=2.0)
    s = 1 / (1 + math.exp(-(math.e - 1)))
    assert close(loss.tolist(), [-2.0, -8 * s, 1.0])
    loss.sum().backward()
    # d/dlogp of -(4/tau) sigmoid(tau (r - 1)) A = -4 s (1 - s) * r * A
    assert close(log_probs.grad.tolist(), [-1.0, -4 * s * (1 - s) * math.e * 2, 1.0])
    assert low_weight.tolist() == [0.0, 1.0 if 4 * s * (1 - s) < 0.5 else 0.0, 0.0]


def test_policy_loss_routes_each_estimator_to_its_term():
    """Off policy by a ratio of 2 on one token: grpo clips it, reinforce/rloo do not, sapo gates it softly."""
    third = -math.log(3)
    batch = {
        "unconcat_tokens": [torch.tensor([0, 1, 2])],
        "total_lengths": [3],
        "response_lengths": [1],
        "loss_masks": [torch.ones(1)],
        "advantages": [torch.tensor([1.0])],
        "log_probs": [torch.tensor([third - math.log(2.0)])],
        "rollout_log_probs": [],
        "ref_log_probs": [],
    }
    reduce = sum_of_sample_mean_fn([1], [torch.ones(1)])
    logits = torch.zeros(1, 3, 3)
    pg = {name: policy_loss(args(advantage_estimator=name), batch, logits, reduce)[1]["pg_loss"].item()
          for name in ("grpo", "reinforce", "rloo", "sapo")}
    s = 1 / (1 + math.exp(-1.0))  # sapo: tau_pos 1, ratio 2
    assert pg == pytest.approx({"grpo": -1.2, "reinforce": -2.0, "rloo": -2.0, "sapo": -4 * s})


def test_gae_by_hand():
    # rewards [0, 0, 1], values [0.5, 0.2, 0.4], gamma 0.9, lambda 0.8
    # deltas: t2 = 1 - 0.4 = 0.6; t1 = 0 + 0.9 * 0.4 - 0.2 = 0.16; t0 = 0.9 * 0.2 - 0.5 = -0.32
    # A2 = 0.6; A1 = 0.16 + 0.72 * 0.6 = 0.592; A0 = -0.32 + 0.72 * 0.592 = 0.10624
    out = gae(torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.5, 0.2, 0.4]), 0.9, 0.8)
    assert close(out.tolist(), [0.10624, 0.592, 0.6])
    # lambda 1, gamma 1: A_t = return - V_t
    assert close(gae(torch.tensor([0.0, 1.0]), torch.tensor([0.3, 0.1]), 1.0, 1.0).tolist(), [0.7, 0.9])


def test_ppo_advantages_put_the_reward_on_the_last_trained_token_and_need_values():
    options = args(advantage_estimator="ppo", gamma=1.0, lambd=1.0, kl_coef=0.5)
    kl = [torch.tensor([0.2, 0.0, 0.4])]
    mask = [torch.tensor([1.0, 1.0, 0.0])]
    values = [torch.tensor([0.1, 0.2, 0.3])]
    # token rewards [-0.1, 1.0, 0.0] (the masked token's KL does not count); returns [0.9, 1.0, 0.0]
    out, returns = compute_advantages(options, [1.0], kl, mask, values)
    assert close(out[0].tolist(), [0.8, 0.8, -0.3])
    assert close(returns[0].tolist(), [0.9, 1.0, 0.0])  # the critic's targets: advantages plus values
    with pytest.raises(ValueError, match="needs the critic's values"):
        compute_advantages(options, [1.0], kl, mask)


def test_the_new_options_are_checked():
    with pytest.raises(ValueError, match="advantage_estimator must be one of"):
        args(advantage_estimator="a2c")
    with pytest.raises(ValueError, match="need lora_rank"):
        args(lora_alpha=16.0)
    with pytest.raises(ValueError, match="for advantage_estimator ppo"):
        args(critic_lr=1e-5)
    with pytest.raises(ValueError, match="give the teacher engine"):
        args(opd_teacher_load="/tmp/teacher")
    with pytest.raises(ValueError, match="do not run on Ray yet"):
        args(lora_rank=8, ray_address="local")
