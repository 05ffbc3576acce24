"""The torch trainer's PPO critic on the tiny Llama of conftest.py: checkpointed and restored with the
policy, critic-only steps, slime's ``values`` for a custom advantage function. (Learning runs of the new
estimators and of on-policy distillation are in test_training_loop.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlsdk import RolloutConfig, Sample


def samples_for(tiny_llama: Path) -> list[list[Sample]]:
    """Two groups of two hand-made samples with rewards 1 and 0."""
    groups = []
    for g in range(2):
        group = []
        for i in range(2):
            tokens = [3 + g, 4, 5, 8 + 4 * i, 9]
            group.append(Sample(group_index=g, index=i, tokens=tokens, response_length=2, reward=float(i == 0),
                                rollout_log_probs=[-1.0, -1.0]))
        groups.append(group)
    return groups


def test_a_checkpoint_restores_the_critic(tiny_llama, tmp_path):
    """The critic's weights and optimizer go into ``critic/`` with the policy and come back on load; a
    checkpoint without a critic is refused for a PPO run."""
    from rlsdk.training.torch_trainer import TorchTrainer

    options = RolloutConfig(hf_checkpoint=str(tiny_llama), advantage_estimator="ppo", lr=1e-2, critic_lr=1e-2,
                            train_threads=1)
    trained = TorchTrainer(options)
    stepped = trained.train_step(0, samples_for(tiny_llama))
    assert stepped["train/critic_value_loss"] > 0 and "train/critic_explained_variance" in stepped
    trained.save_checkpoint(tmp_path / "ckpt")
    fresh = TorchTrainer(options)
    before = dict(fresh.critic.model.state_dict())
    want = trained.critic.model.state_dict()
    assert any(not torch.equal(before[k], want[k]) for k in want)  # the step changed the critic
    fresh.load_checkpoint(tmp_path / "ckpt")
    got = fresh.critic.model.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert fresh.critic.optimizer.state_dict()["state"].keys() == trained.critic.optimizer.state_dict()["state"].keys()
    assert fresh.critic.optimizer.state_dict()["state"]  # Adam's moments came back
    plain = RolloutConfig(hf_checkpoint=str(tiny_llama), train_threads=1)
    TorchTrainer(plain).save_checkpoint(tmp_path / "no-critic")
    with pytest.raises(FileNotFoundError, match="holds no critic"):
        fresh.load_checkpoint(tmp_path / "no-critic")


def test_critic_only_steps_leave_the_policy_alone(tiny_llama):
    from rlsdk.training.torch_trainer import TorchTrainer

    options = RolloutConfig(hf_checkpoint=str(tiny_llama), advantage_estimator="ppo", lr=1e-2,
                            num_critic_only_steps=1, train_threads=1)
    trainer = TorchTrainer(options)
    policy = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    out = trainer.train_step(0, samples_for(tiny_llama))
    assert "train/critic_value_loss" in out and "train/pg_loss" not in out
    assert all(torch.equal(policy[k], v) for k, v in trainer.model.state_dict().items())
    assert "train/pg_loss" in trainer.train_step(1, samples_for(tiny_llama))


def test_ppo_advantages_reach_a_custom_advantage_function_with_values(tiny_llama, tmp_path):
    """slime's ``rollout_data["values"]``: a custom function sees the critic's values and must set returns."""
    from rlsdk.training.torch_trainer import TorchTrainer

    path = tmp_path / "adv.py"
    path.write_text("def adv(args, data):\n    data['advantages'] = [v * 0 + 1 for v in data['values']]\n")
    options = RolloutConfig(hf_checkpoint=str(tiny_llama), advantage_estimator="ppo", train_threads=1,
                            custom_advantage_function_path=f"{path}:adv")
    with pytest.raises(ValueError, match=r"did not set rollout_data\['returns'\]"):
        TorchTrainer(options).train_step(0, samples_for(tiny_llama))
