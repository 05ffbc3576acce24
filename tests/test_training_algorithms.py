"""The torch trainer's PPO critic on the tiny Llama of conftest.py: checkpointed and restored with the
policy, critic-only steps, slime's ``values`` for a custom advantage function. (Learning runs of the new
estimators and of on-policy distillation are in test_training_loop.py.)"""

from __future__ import annotations

import subprocess
import sys
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


def rlsdk(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlsdk_cli.app", *args], capture_output=True, text=True, timeout=120)


def test_a_lora_checkpoint_holds_the_adapter_and_export_merges_it_on_request(tiny_llama, tmp_path):
    """The checkpoint of a LoRA trainer has the adapter and no model; ``rlsdk export`` copies the adapter, and
    with ``--merge --base`` writes a plain model whose log-probs are the trained policy's."""
    from transformers import AutoModelForCausalLM

    from rlsdk.training.torch_trainer import TorchTrainer

    trainer = TorchTrainer(RolloutConfig(hf_checkpoint=str(tiny_llama), lora_rank=4, lr=5e-2, train_threads=1))
    for step in range(2):
        trainer.train_step(step, samples_for(tiny_llama))
    ckpt = tmp_path / "step_1"
    trainer.save_checkpoint(ckpt)
    assert (ckpt / "adapter_model.safetensors").exists() and not (ckpt / "model.safetensors").exists()
    resumed = TorchTrainer(RolloutConfig(hf_checkpoint=str(tiny_llama), lora_rank=4, lr=5e-2, train_threads=1))
    probe = samples_for(tiny_llama)[0][0]
    assert resumed.response_log_probs([probe]) != trainer.response_log_probs([probe])
    resumed.load_checkpoint(ckpt)  # the adapter and its optimizer state come back
    assert resumed.response_log_probs([probe]) == trainer.response_log_probs([probe])
    assert resumed.optimizer.state_dict()["state"].keys() == trainer.optimizer.state_dict()["state"].keys()

    plain = rlsdk("export", str(ckpt), "--output", str(tmp_path / "adapter"))
    assert plain.returncode == 0, plain.stderr
    assert (tmp_path / "adapter" / "adapter_config.json").exists()
    assert not (tmp_path / "adapter" / "optimizer.pt").exists()

    refused = rlsdk("export", str(ckpt), "--merge", "--output", str(tmp_path / "merged"))
    assert refused.returncode != 0 and "--merge needs --base" in refused.stderr

    merged = rlsdk("export", str(ckpt), "--merge", "--base", str(tiny_llama), "--output", str(tmp_path / "merged"))
    assert merged.returncode == 0, merged.stderr
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    with torch.no_grad():
        ids = torch.tensor([probe.tokens])
        picked = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    expected = trainer.response_log_probs([probe])[0]
    base_model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    with torch.no_grad():
        base = torch.log_softmax(base_model(input_ids=ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    got = picked.tolist()[-probe.response_length:]
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < 1e-4
    assert max(abs(a - b) for a, b in zip(base.tolist()[-2:], expected, strict=True)) > 1e-3  # training mattered
    # the trainer's merged weights (what save_hf_model writes for engines without adapters) are the same model
    weights = trainer.weights()
    assert max(float((weights[k] - v).abs().max()) for k, v in model.state_dict().items()) < 1e-5


def test_lora_runs_sync_through_disk_and_launch_sglang_with_lora():
    """A LoRA adapter never travels as whole weights; a launched SGLang gets the LoRA flags it needs."""
    from rlsdk.engine_api import SGLangClient
    from rlsdk.engines.launch.sglang import lora_flags
    from rlsdk.training.sync import DiskSync, choose_sync

    client = SGLangClient("http://127.0.0.1:9")
    lora = RolloutConfig(lora_rank=16, colocate=True)
    assert isinstance(choose_sync(lora, client, Path("/tmp/unused")), DiskSync)  # not CUDA IPC of whole weights
    for mode in ("tensor", "nccl"):
        with pytest.raises(ValueError, match="syncs its adapter"):
            choose_sync(RolloutConfig(lora_rank=16, colocate=True, weight_sync=mode), client, Path("/tmp/unused"))
    assert lora_flags(lora, []) == ["--enable-lora", "--max-lora-rank", "16", "--lora-target-modules", "all"]
    targets = RolloutConfig(lora_rank=8, lora_target_modules=["q_proj", "v_proj"])
    assert lora_flags(targets, [])[-2:] == ["q_proj", "v_proj"]
    assert lora_flags(targets, ["--enable-lora"]) == [] and lora_flags(RolloutConfig(), []) == []
