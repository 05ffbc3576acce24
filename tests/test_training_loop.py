"""``rlsdk run --train`` for real: a tiny randomly initialised Llama (``tiny_llama`` in conftest.py, with
SmolLM2's tokenizer) in the embedded engine and the torch trainer, on CPU in seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlsdk import Loss, PluginCallError, RolloutConfig, Trainer, get_plugin_manager, hookimpl
from rlsdk.run.job import run_job
from rlsdk.testing import check_loss, check_trainer
from rlsdk.training.sync import WeightSyncError

REWARD_FILE = '''
def first_token_mod4(args, sample, **kwargs):
    """1 when the first response token id is a multiple of 4 (a quarter of the vocabulary)."""
    return float(sample.response_length > 0 and sample.tokens[sample.prompt_length] % 4 == 0)
'''


@pytest.fixture
def run_files(tmp_path: Path) -> tuple[Path, str]:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"w{i} w{i + 1} w{i + 2}"}) + "\n" for i in range(16)))
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD_FILE)
    return data, f"{reward}:first_token_mod4"


def train_args(tiny_llama: Path, run_files: tuple[Path, str], out: Path, **options) -> RolloutConfig:
    data, reward = run_files
    values = {"model": str(tiny_llama), "prompt_data": str(data), "rm_type": reward, "train": True, "lr": 3e-2,
              "rollout_batch_size": 4, "n_samples_per_prompt": 8, "rollout_max_response_len": 2, "num_rollout": 12,
              "engine_threads": 1, "train_threads": 1, "output_dir": str(out), "sync_check_tol": 1e-3}
    values.update(options)
    return RolloutConfig(**values)


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
@pytest.mark.slow
def test_the_reward_rises(tiny_llama, run_files, tmp_path):
    """GRPO on a reward a quarter of random first tokens earn: the policy learns to earn it."""
    out = tmp_path / "out"
    run_job(train_args(tiny_llama, run_files, out, report_to="tensorboard"))
    rows = metrics(out)
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    start = sum(r["rollout/reward_mean"] for r in rows[:3]) / 3
    end = sum(r["rollout/reward_mean"] for r in rows[-3:]) / 3
    assert end > start + 0.3, [round(r["rollout/reward_mean"], 3) for r in rows]
    assert all(r["train/sync_logprob_max_diff"] < 1e-3 for r in rows)
    versions = [json.loads(line)["weight_versions"] for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert versions[0] == ["default"] and versions[-1] == [str(len(rows) - 1)]  # sampled by its step's policy
    assert (out / "curves.png").stat().st_size > 0
    assert (out / "checkpoints" / f"step_{len(rows) - 1}" / "model.safetensors").exists()


class LyingTrainer:
    """A torch trainer whose weights for the engine are perturbed: the engine serves other weights."""

    @hookimpl
    def rlsdk_trainers(self):
        def lying(args):
            from rlsdk.training.torch_trainer import TorchTrainer

            class Lying(TorchTrainer):
                def weights(self):
                    return {k: v + 0.05 * torch.randn_like(v) for k, v in super().weights().items()}

            return Lying(args)

        yield Trainer(name="lying", func=lying)


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
def test_the_trust_check_stops_a_run_whose_engine_serves_other_weights(tiny_llama, run_files, tmp_path):
    pm = get_plugin_manager(plugins=[LyingTrainer()])
    args = train_args(tiny_llama, run_files, tmp_path / "out", trainer="lying", num_rollout=2)
    with pytest.raises(WeightSyncError, match="serving other weights than the trainer's"):
        run_job(args, pm)


CALLS: list[str] = []


def reinforce(args, batch, logits, sum_of_sample_mean):
    """Plain REINFORCE on the trained tokens."""
    from rlsdk.training.losses import log_probs_and_entropy

    CALLS.append("reinforce")
    log_probs, _ = log_probs_and_entropy(logits, batch, args, with_entropy=False)
    loss = sum_of_sample_mean(-torch.cat(batch["advantages"]) * torch.cat(log_probs))
    return loss, {"loss": loss.detach()}


class ReinforcePlugin:
    @hookimpl
    def rlsdk_losses(self):
        yield Loss(name="reinforce", func=reinforce)


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
def test_a_custom_loss_by_name_and_by_dotted_path(tiny_llama, run_files, tmp_path):
    pm = get_plugin_manager(plugins=[ReinforcePlugin()])
    check_loss(pm, "reinforce")
    check_loss(pm, "policy_loss", RolloutConfig(use_kl_loss=True, kl_loss_coef=0.1, use_tis=True))
    CALLS.clear()
    run_job(train_args(tiny_llama, run_files, tmp_path / "by-name", num_rollout=1, loss_type="custom_loss",
                       custom_loss_function_path="reinforce"), pm)
    assert CALLS and "train/loss" in metrics(tmp_path / "by-name")[0]
    path = tmp_path / "my_loss.py"
    path.write_text("from rlsdk.training.losses import sft_loss as my_sft\n")
    run_job(train_args(tiny_llama, run_files, tmp_path / "by-path", num_rollout=1, loss_type="custom_loss",
                       custom_loss_function_path=f"{path}:my_sft"))
    assert metrics(tmp_path / "by-path")[0]["train/loss"] > 0  # an NLL


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
def test_an_engine_over_http_takes_the_weights_from_disk(tiny_llama, run_files, tmp_path):
    """The path of an SGLang server (``--engine URL``): the trainer writes a Hugging Face folder, the engine
    loads it through ``/update_weights_from_disk`` and the trust check asks for prompt log-probs over HTTP.
    The server is ``rlsdk serve``'s, speaking SGLang's protocol, since SGLang needs a GPU."""
    from rlsdk.testing import ServedEngine

    EmbeddedEngine = pytest.importorskip("rlsdk_embedded").EmbeddedEngine

    out = tmp_path / "out"
    with ServedEngine(EmbeddedEngine(str(tiny_llama), device="cpu", threads=1), weights_dirs=[out]) as served:
        run_job(train_args(tiny_llama, run_files, out, engine=served.url, hf_checkpoint=str(tiny_llama),
                           num_rollout=2))
        served_version = served.run(served.engine.model_info())["weight_version"]
    rows = metrics(out)
    assert [r["train/weight_version"] for r in rows] == [1, 2] and served_version == "2"
    assert all(r["train/sync_logprob_max_diff"] < 1e-3 for r in rows)
    assert (out / "sync-weights" / "model.safetensors").exists()


def test_the_torch_trainer_passes_the_contract_check(tiny_llama):
    check_trainer(get_plugin_manager(), "torch", RolloutConfig(hf_checkpoint=str(tiny_llama), lr=1e-3,
                                                              train_threads=1))


def rlsdk(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlsdk_cli.app", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kwargs)


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
@pytest.mark.slow
def test_sigkill_then_resume_with_no_flags_reaches_the_uninterrupted_parameters(tiny_llama, run_files, tmp_path):
    data, reward = run_files
    flags = ["--train", "--model", str(tiny_llama), "--data", str(data), "--rm", reward, "--lr", "3e-3",
             "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "3",
             "--num-rollout", "4", "--save-interval", "1", "--deterministic", "--rollout-shuffle",
             "--set", "engine_threads=1", "--train-threads", "1"]
    whole = rlsdk("run", *flags, "--output", str(tmp_path / "whole"))
    assert whole.wait(timeout=240) == 0, whole.stdout.read()

    cut = tmp_path / "cut"
    killed = rlsdk("run", *flags, "--output", str(cut), start_new_session=True)
    deadline = time.monotonic() + 240
    while not (cut / "checkpoints" / "step_1").exists():
        assert killed.poll() is None and time.monotonic() < deadline, killed.stdout.read()
        time.sleep(0.05)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    resumed = rlsdk("run", "--resume", "--output", str(cut))
    assert resumed.wait(timeout=240) == 0, resumed.stdout.read()

    from safetensors.torch import load_file

    a = load_file(tmp_path / "whole" / "checkpoints" / "step_3" / "model.safetensors")
    b = load_file(cut / "checkpoints" / "step_3" / "model.safetensors")
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    assert (cut / "rollouts.jsonl").read_text().count("\n") == (tmp_path / "whole" / "rollouts.jsonl").read_text().count("\n")


def test_resume_refuses_a_conflicting_flag(tmp_path):
    from rlsdk.run.output import resumed_settings

    (tmp_path / "state.json").write_text(json.dumps({"settings": {"lr": 1e-5, "num_rollout": 3}}))
    assert resumed_settings(tmp_path, {"num_rollout": 9})["num_rollout"] == 9
    with pytest.raises(ValueError, match="lr"):
        resumed_settings(tmp_path, {"lr": 1e-3})


def test_the_step_tables_show_a_dash_for_what_a_rollout_did_not_report():
    """A slime-style rollout returning a bare list reports no ledger: the table must not fail (issue 19, item 3)."""
    from rich.console import Console

    from rlsdk_cli.run import step_table

    console = Console(width=80, record=True)
    console.print(step_table(0, {}))
    console.print(step_table(1, {"rollout/reward_mean": 0.5, "ledger/kept": 4, "train/loss": 0.25}))
    text = console.export_text()
    assert "0.500" in text and "0.2500" in text and "step 1: train" in text
    assert max(len(line) for line in text.splitlines()) <= 80


@pytest.mark.plugins('rlsdk_megatron')
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_trainer_megatron_is_chosen_by_name_and_says_it_needs_cuda(tiny_llama, run_files, tmp_path):
    """``--trainer megatron`` reaches rlsdk-megatron's trainer (an installed plugin, by name) after the
    engine starts; on CPU it stops the run with what to use instead, named as the trainer call point names
    a plugin's failure."""
    with pytest.raises(PluginCallError, match="trainer 'megatron' from rlsdk-megatron .*building the trainer raised RuntimeError: rlsdk-megatron trains on CUDA GPUs only: use --trainer torch"):
        run_job(train_args(tiny_llama, run_files, tmp_path / "out", trainer="megatron", num_rollout=1))
