"""``rlsdk run --engine vllm --vllm-url URL --train`` for real on the tiny Llama, the vLLM server being the stand-in
(:mod:`rlsdk_engine_vllm.stand_in`, vLLM 0.26's routes in front of the embedded engine; vLLM needs CUDA): the
colocated path (sleep, wake the weights, the trainer's tensors by IPC, wake the cache) learns, with the trust
check after every sync; the disk path (``reload_weights``) serves each step's weights as its version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlsdk import RolloutConfig
from rlsdk import run_job

from rlsdk_engine_vllm.stand_in import ServedVLLM

REWARD = '''
def first_token_mod4(args, sample, **kwargs):
    """1 when the first response token id is a multiple of 4 (a quarter of the vocabulary)."""
    return float(sample.response_length > 0 and sample.tokens[sample.prompt_length] % 4 == 0)
'''


def run_args(tiny_llama: Path, tmp_path: Path, url: str, **options: object) -> RolloutConfig:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"w{i} w{i + 1} w{i + 2}"}) + "\n" for i in range(16)))
    (tmp_path / "reward.py").write_text(REWARD)
    values = {
        "engine": "vllm",
        "vllm_url": url,
        "hf_checkpoint": str(tiny_llama),
        "prompt_data": str(data),
        "rm_type": f"{tmp_path / 'reward.py'}:first_token_mod4",
        "train": True,
        "lr": 3e-2,
        "rollout_batch_size": 4,
        "n_samples_per_prompt": 8,
        "rollout_max_response_len": 2,
        "num_rollout": 12,
        "train_threads": 1,
        "output_dir": str(tmp_path / "out"),
        "sync_check_tol": 1e-3,
        **options,
    }
    return RolloutConfig(**values)


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def served(tiny_llama: Path):
    from rlsdk_embedded.engine import EmbeddedEngine

    with ServedVLLM(EmbeddedEngine(str(tiny_llama), device="cpu", threads=1), str(tiny_llama)) as running:
        yield running


@pytest.mark.slow
def test_a_colocated_run_learns_through_vllms_sleep_and_ipc_updates(served, tiny_llama, tmp_path):
    run_job(run_args(tiny_llama, tmp_path, served.url, colocate=True))
    rows = metrics(tmp_path / "out")
    rewards = [r["rollout/reward_mean"] for r in rows]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.3, [round(r, 3) for r in rewards]
    assert all(r["train/sync_logprob_max_diff"] < 1e-3 for r in rows)
    assert [r["train/weight_version"] for r in rows] == list(range(1, 13))
    calls = [c.split("?")[0] for c in served.state.calls]
    step = calls[calls.index("/sleep") : calls.index("/sleep", calls.index("/sleep") + 1)]
    assert [c for c in step if c != "/v1/completions"][:4] == [
        "/sleep",
        "/wake_up",
        "/start_weight_update",
        "/update_weights",
    ]
    assert "/finish_weight_update" in step and not served.state.dead
    assert "?level=2&mode=abort" in served.state.calls[calls.index("/sleep")]


def test_a_run_over_disk_serves_each_steps_weights_as_its_version(served, tiny_llama, tmp_path):
    run_job(run_args(tiny_llama, tmp_path, served.url, num_rollout=2))
    rows = metrics(tmp_path / "out")
    assert [r["train/weight_version"] for r in rows] == [1, 2]
    assert all(r["train/sync_logprob_max_diff"] < 1e-3 for r in rows)
    assert served.state.calls.count("/collective_rpc") >= 2  # reload_weights, each step
    versions = [
        json.loads(line)["weight_versions"]
        for line in (tmp_path / "out" / "rollouts.jsonl").read_text().splitlines()
    ]
    assert versions[0] == ["default"] and versions[-1] == ["1"]  # sampled under its step's policy
