"""The ``megatron`` trainer is registered by entry point, listed, and refuses clearly where it cannot run."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from rlsdk import RolloutConfig, get_plugin_manager
from rlsdk_cli.app import app
from rlsdk_megatron.trainer import parallel_sizes


def test_listed_and_resolvable():
    listing = json.loads(CliRunner().invoke(app, ["plugins", "list", "--json"]).stdout)
    assert any(p["distribution"] == "rlsdk-megatron" for p in listing)
    assert get_plugin_manager().resolve("trainer", "megatron").func.__module__ == "rlsdk_megatron.plugin"


def test_parallel_sizes_follow_slimes_flags():
    args = RolloutConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    assert parallel_sizes(args, 8) == (2, 2, 2)
    with pytest.raises(
        ValueError, match="6 GPU\\(s\\) cannot hold tensor-parallel size 2 x pipeline-parallel size 2"
    ):
        parallel_sizes(args, 6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_without_cuda_the_trainer_says_to_use_torch():
    with pytest.raises(RuntimeError, match="CUDA GPUs only: use --trainer torch"):
        get_plugin_manager().resolve("trainer", "megatron").func(RolloutConfig(hf_checkpoint="/m"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_several_gpus_are_refused_on_cpu_before_any_rank_starts():
    args = RolloutConfig(hf_checkpoint="/m", tensor_model_parallel_size=2)
    with pytest.raises(RuntimeError, match="CUDA GPUs only"):
        get_plugin_manager().resolve("trainer", "megatron").func(args)


SMOLLM2_SHAPE = {
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "num_hidden_layers": 30,
    "vocab_size": 49152,
}


@pytest.mark.parametrize(
    ("sizes", "refusal"),
    [
        ({"tensor_model_parallel_size": 2}, "tensor-parallel size 2 does not divide the 9 attention heads"),
        ({"pipeline_model_parallel_size": 4}, "pipeline-parallel size 4 does not divide the 30 layers"),
    ],
)
def test_sizes_the_trainer_cannot_take_stop_the_run_before_any_engine_starts(tmp_path, sizes, refusal):
    """SmolLM2-135M's 9 heads cannot be split in two, nor its 30 layers over 4 stages: the run stops while
    it resolves its plugins, not after the engines started (the engine here is a dead address, whose error would come otherwise)."""
    from rlsdk import run_job

    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2_SHAPE))
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"input": "1+1", "label": "2"}\n')
    args = RolloutConfig(
        train=True,
        trainer="megatron",
        hf_checkpoint=str(tmp_path),
        engine="http://127.0.0.1:9",
        prompt_data=str(data),
        output_dir=str(tmp_path / "out"),
        **sizes,
    )
    with pytest.raises(ValueError, match=refusal):
        run_job(args)
