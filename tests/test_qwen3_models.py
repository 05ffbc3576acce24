"""Qwen3 (QK-norm) and Qwen3-MoE on CPU through the torch trainer and the embedded engine: a train step
moves the weights, the engine takes them in process, and its log-probs of a sample's response then equal
the trainer's (float32 both sides). Tiny shapes (2 layers, 4 experts, top-2) with tiny_llama's
word-level tokenizer; the published shapes run on GPUs (benchmarks/gpu/scale.py)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
import torch

from rlsdk import RolloutConfig, Sample
from rlsdk.training.sync import engine_log_probs
from rlsdk.training.torch_trainer import TorchTrainer

SHAPE = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 32,
    "max_position_embeddings": 256,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 1,
}
MOE = {"moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2, "norm_topk_prob": True}


def qwen3_folder(model_type: str, tiny_llama: Path, folder: Path) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    extra = MOE if model_type == "qwen3_moe" else {}
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **SHAPE, **extra)).save_pretrained(
        folder
    )
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_llama / name, folder / name)
    return folder


@pytest.mark.plugins("rlsdk_embedded")
@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_moe"])
def test_torch_trainer_trains_and_the_embedded_engine_serves_its_weights(model_type, tiny_llama, tmp_path):
    from rlsdk_embedded.engine import EmbeddedEngine

    folder = qwen3_folder(model_type, tiny_llama, tmp_path / model_type)
    trainer = TorchTrainer(
        RolloutConfig(hf_checkpoint=str(folder), train=True, train_threads=1, lr=1e-2, loss_type="sft_loss")
    )
    before = {k: v.clone() for k, v in trainer.weights().items()}
    samples = [
        Sample(
            index=i,
            tokens=[2, 3, 4, 5 + i, 6, 7 + i],
            response_length=3,
            reward=1.0,
            status=Sample.Status.COMPLETED,
        )
        for i in range(4)
    ]
    metrics = trainer.train_step(0, [samples])
    assert metrics["train/loss"] > 0
    moved = [name for name, tensor in trainer.weights().items() if not torch.equal(tensor, before[name])]
    assert any("q_norm" in name for name in moved) and any("mlp" in name for name in moved)

    async def served() -> list[float]:
        engine = EmbeddedEngine(str(folder), device="cpu", threads=1)
        await engine.start()
        try:
            await engine.update_weights(trainer.weights(), "1")
            return await engine_log_probs(engine, samples[0])
        finally:
            await engine.close()

    expected = trainer.response_log_probs([samples[0]])[0]
    gap = max(abs(a - b) for a, b in zip(asyncio.run(served()), expected, strict=True))
    assert gap < 1e-4, f"engine vs trainer log-probs differ by {gap:.3g} nats"
