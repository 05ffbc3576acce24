"""slime's advantage estimators and losses against values worked out by hand on small tensors."""

from __future__ import annotations

import math

import pytest
import torch

from rlsdk import Loss, RolloutConfig
from rlsdk.training.advantages import approx_kl, compute_advantages, normalize_rewards
from rlsdk.training.batch import response_rows
from rlsdk.training.losses import (
    cispo_loss,
    clipped_policy_loss,
    policy_loss,
    response_logits,
    sequence_kl,
    sum_of_sample_mean_fn,
)


def args(**options):
    return RolloutConfig(**options)


def close(a, b, tol=1e-5):
    return all(abs(x - y) < tol for x, y in zip(a, b, strict=True))


def test_grpo_normalizes_uneven_groups_and_zeroes_equal_rewards():
    # group of 4 with mean 0.5, unbiased std sqrt(1/3); a group of 3 equal rewards; a lone sample
    out = normalize_rewards(args(), [1, 0, 0, 1, 1, 1, 1, 0.7], [4, 3, 1])
    z = 0.5 / math.sqrt(1 / 3)
    assert close(out, [z, -z, -z, z, 0, 0, 0, 0.0], tol=1e-4)


def test_dr_grpo_baseline_and_raw_rewards():
    rewards, sizes = [1.0, 0.0, 0.0, 0.0], [4]
    assert close(normalize_rewards(args(disable_grpo_std_normalization=True), rewards, sizes), [0.75, -0.25, -0.25, -0.25])
    assert close(normalize_rewards(args(advantage_estimator="reinforce_plus_plus_baseline"), rewards, sizes),
                 [0.75, -0.25, -0.25, -0.25])
    assert normalize_rewards(args(advantage_estimator="reinforce_plus_plus"), rewards, sizes) == rewards
    assert normalize_rewards(args(disable_rewards_normalization=True), rewards, sizes) == rewards


def test_kl_estimators():
    new, ref = torch.tensor([0.5]), torch.tensor([0.0])
    assert approx_kl(new, ref, "k1").item() == pytest.approx(0.5)
    assert approx_kl(new, ref, "k2").item() == pytest.approx(0.125)
    assert approx_kl(new, ref, "k3").item() == pytest.approx(math.exp(-0.5) - 1 + 0.5)
    assert approx_kl(torch.tensor([-30.0]), ref, "low_var_kl").item() == 10.0  # clamped


def test_reinforce_plus_plus_returns_put_the_reward_on_the_last_trained_token():
    kl = [torch.tensor([0.1, 0.2, 0.3])]
    mask = [torch.tensor([1.0, 1.0, 0.0])]
    out, returns = compute_advantages(args(advantage_estimator="reinforce_plus_plus", kl_coef=0.5), [1.0], kl, mask)
    assert returns is None  # no critic
    assert close(out[0].tolist(), [0.85, 0.9, 0.0])
    gamma, _ = compute_advantages(args(advantage_estimator="reinforce_plus_plus", kl_coef=0.5, gamma=0.5), [1.0], kl,
                                  mask)
    assert close(gamma[0].tolist(), [-0.05 + 0.45, 0.9, 0.0])


def test_baseline_advantages_subtract_kl_and_whitening_keeps_masked_tokens_at_zero():
    kl = [torch.tensor([0.2, 0.0])]
    out, _ = compute_advantages(args(advantage_estimator="reinforce_plus_plus_baseline", kl_coef=0.5), [1.0], kl,
                                [torch.ones(2)])
    assert close(out[0].tolist(), [0.9, 1.0])
    whitened, _ = compute_advantages(args(normalize_advantages=True), [1.0, -1.0], [torch.zeros(2), torch.zeros(2)],
                                     [torch.tensor([1.0, 0.0]), torch.ones(2)])
    values = torch.cat(whitened)
    assert values[1] == 0 and abs(float(values[[0, 2, 3]].sum())) < 1e-5


def test_clipped_loss_clip_higher_and_dual_clip():
    ratio = torch.tensor([1.5, 0.5, 1.0, 5.0])
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss, clipped = clipped_policy_loss(-ratio.log(), advantages, 0.2, 0.28)
    assert close(loss.tolist(), [-1.28, 0.8, -1.0, 5.0])
    assert clipped.tolist() == [1.0, 1.0, 0.0, 0.0]
    dual, _ = clipped_policy_loss(-ratio.log(), advantages, 0.2, 0.28, eps_clip_c=3.0)
    assert close(dual.tolist(), [-1.28, 0.8, -1.0, 3.0])


def test_cispo_gradient_flows_through_log_probs_of_clipped_tokens():
    log_probs = torch.tensor([-1.0, -2.0], requires_grad=True)
    old = torch.tensor([-1.0 - math.log(2.0), -2.0])  # ratio 2 (clipped to 1.28), ratio 1
    loss, clipped = cispo_loss(old - log_probs, log_probs, torch.tensor([1.0, 1.0]), 1.0, 0.28)
    loss.sum().backward()
    assert clipped.tolist() == [1.0, 0.0]
    assert close(log_probs.grad.tolist(), [-1.28, -1.0])


def test_sequence_kl_is_the_masked_mean_per_sample():
    old = [torch.tensor([0.0, 0.0, 0.0]), torch.tensor([0.0])]
    new = [torch.tensor([0.2, 0.4, 9.0]), torch.tensor([-0.5])]
    masks = [torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1.0])]
    assert close(sequence_kl(old, new, masks).tolist(), [-0.3, -0.3, -0.3, 0.5])


def test_sum_of_sample_mean_and_per_token_reduction_honour_the_mask():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    masks = [torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1.0, 1.0])]
    assert sum_of_sample_mean_fn([3, 2], masks)(x).item() == pytest.approx(2 + 4.5)
    assert sum_of_sample_mean_fn([3, 2], masks, per_token=True)(x).item() == pytest.approx(13)


def uniform_batch(advantages: list[list[float]], masks: list[list[float]], rollout=None) -> tuple[dict, torch.Tensor]:
    """Two samples (prompt of 2 tokens each) over a vocabulary of 3 with all-zero logits: every
    log-prob is -log 3 and every entropy log 3."""
    responses = [len(a) for a in advantages]
    totals = [2 + n for n in responses]
    batch = {
        "unconcat_tokens": [torch.tensor([0, 1, *([2] * n)]) for n in responses],
        "total_lengths": totals,
        "response_lengths": responses,
        "loss_masks": [torch.tensor(m) for m in masks],
        "advantages": [torch.tensor(a) for a in advantages],
        "log_probs": [],
        "rollout_log_probs": rollout or [],
        "ref_log_probs": [torch.full((n,), -math.log(3)) for n in responses],
    }
    return batch, torch.zeros(1, sum(totals), 3, requires_grad=True)


def test_policy_loss_on_policy_is_minus_the_mean_advantage_of_trained_tokens():
    batch, logits = uniform_batch([[0.5, 0.5, 7.0], [-1.0]], [[1, 1, 0], [1]])
    reduce = sum_of_sample_mean_fn(batch["response_lengths"], batch["loss_masks"])
    loss, metrics = policy_loss(args(entropy_coef=0.1), batch, logits, reduce)
    # pg: sample means -0.5 and +1 (the masked token's 7.0 never counts); entropy: log 3 per sample
    assert metrics["pg_loss"].item() == pytest.approx(0.5)
    assert metrics["entropy_loss"].item() == pytest.approx(2 * math.log(3))
    assert loss.item() == pytest.approx(0.5 - 0.1 * 2 * math.log(3))
    assert metrics["pg_clipfrac"].item() == 0 and metrics["ppo_kl"].item() == 0
    loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_policy_loss_tis_weights_and_kl_term():
    third = -math.log(3)
    rollout = [torch.tensor([third - math.log(4.0)]), torch.tensor([third])]  # TIS ratios 4 (clipped to 2) and 1
    batch, logits = uniform_batch([[1.0], [1.0]], [[1], [1]], rollout=rollout)
    batch["ref_log_probs"] = [torch.tensor([third - 0.5]), torch.tensor([third])]  # k1 = 0.5 and 0
    reduce = sum_of_sample_mean_fn(batch["response_lengths"], batch["loss_masks"])
    options = args(use_tis=True, use_kl_loss=True, kl_loss_coef=0.1)
    loss, metrics = policy_loss(options, batch, logits, reduce)
    assert metrics["pg_loss"].item() == pytest.approx(-2.0 - 1.0)
    assert metrics["tis"].item() == pytest.approx(4.0 + 1.0)
    assert metrics["tis_clipfrac"].item() == pytest.approx(1.0)
    assert metrics["kl_loss"].item() == pytest.approx(0.5)
    assert loss.item() == pytest.approx(-3.0 + 0.05)
    assert metrics["train_rollout_logprob_abs_diff"].item() == pytest.approx(math.log(4.0))


def test_shared_prompts_give_the_logits_of_separate_sequences():
    """One row per distinct prompt (responses masked from each other) equals one forward per sample."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlsdk.training.batch import SharedPrompts, TrainSample

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(config).eval()

    def sample(tokens, response):
        return TrainSample(torch.tensor(tokens), response, torch.ones(response), None, 0.0)

    data = [sample([1, 2, 3, 4, 5], 2), sample([1, 2, 3, 6, 7, 8], 3), sample([9, 4, 5], 1), sample([1, 2, 3, 9], 1),
            sample([1, 2, 3], 0)]  # an empty response: no row of its own
    layout = SharedPrompts.build(data, [0, 1, 2, 3, 4])
    assert layout.input_ids.shape[0] == 2  # prompts [1, 2, 3] and [9, 4]
    with torch.no_grad():
        packed = model(input_ids=layout.input_ids, position_ids=layout.position_ids,
                       attention_mask=layout.attention_mask).logits.flatten(0, 1)[layout.gather]
        separate = torch.cat([model(input_ids=d.tokens[None]).logits[0] for d in data])
        # a response loss's rows: projected at the predicting positions only, in the samples' order
        kept = model(input_ids=layout.input_ids, position_ids=layout.position_ids,
                     attention_mask=layout.attention_mask, logits_to_keep=layout.keep).logits
        responses = kept.flatten(0, 1)[layout.response_gather]
    assert (packed - separate).abs().max() < 1e-5
    assert len(layout.keep) < layout.input_ids.shape[1]  # not every position is projected
    lengths = [d.total_length for d in data], [d.response_length for d in data]
    assert (responses - separate[response_rows(*lengths)]).abs().max() < 1e-5
    batch = {"total_lengths": lengths[0], "response_lengths": lengths[1]}
    assert torch.allclose(response_logits(responses[None], batch), response_logits(separate[None], batch), atol=1e-5)


def test_a_loss_says_which_logits_it_reads():
    """``packed`` (slime's layout, the default) or ``response``; anything else is refused at registration."""
    assert Loss(name="mine", func=policy_loss).logits == "packed"
    with pytest.raises(ValueError, match="logits must be 'packed' or 'response'"):
        Loss(name="mine", func=policy_loss, logits="all")


def test_a_sample_without_a_prompt_token_is_refused():
    """Its first response token would be predicted from nothing."""
    from rlsdk import Sample
    from rlsdk.training.batch import TrainSample

    with pytest.raises(ValueError, match="leaves no prompt token"):
        TrainSample.from_sample(Sample(tokens=[4, 5], response_length=2), 1.0)
