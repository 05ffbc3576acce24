"""``rlsdk run --train`` for real: a tiny randomly initialised Llama (``tiny_llama`` in conftest.py, with
SmolLM2's tokenizer) in the embedded engine and the torch trainer, on CPU in seconds."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from rlsdk import Loss, PluginCallError, RolloutConfig, Trainer, get_plugin_manager, hookimpl
from rlsdk.run.job import run_job
from rlsdk.testing import check_loss, check_trainer
from rlsdk.training.sync import WeightSyncError

@pytest.fixture
def train_args(train_args):
    """The shared tiny training run, 12 steps long unless a test says otherwise."""
    return functools.partial(train_args, num_rollout=12)


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
@pytest.mark.slow
def test_the_reward_rises(tiny_llama, run_files, tmp_path, train_args):
    """GRPO on a reward a quarter of random first tokens earn: the policy learns to earn it."""
    out = tmp_path / "out"
    run_job(train_args(tiny_llama, run_files, out, report_to="tensorboard"))
    rows = metrics(out)
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    start, end = reward_rise(rows)
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
def test_the_trust_check_stops_a_run_whose_engine_serves_other_weights(tiny_llama, run_files, tmp_path, train_args):
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
def test_a_custom_loss_by_name_and_by_dotted_path(tiny_llama, run_files, tmp_path, train_args):
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
def test_an_engine_over_http_takes_the_weights_from_disk(tiny_llama, run_files, tmp_path, train_args):
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


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
@pytest.mark.slow
def test_sigkill_then_resume_with_no_flags_reaches_the_uninterrupted_parameters(
    tiny_llama, run_files, rlsdk_cli, kill_and_resume, tmp_path
):
    data, reward = run_files
    flags = ["--train", "--model", str(tiny_llama), "--data", str(data), "--rm", reward, "--lr", "3e-3",
             "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "3",
             "--num-rollout", "4", "--save-interval", "1", "--deterministic", "--rollout-shuffle",
             "--set", "engine_threads=1", "--train-threads", "1"]
    whole = rlsdk_cli("run", *flags, "--output", str(tmp_path / "whole"))
    assert whole.wait(timeout=240) == 0, whole.stdout.read()

    cut = tmp_path / "cut"
    kill_and_resume(flags, cut)

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


def test_resume_applies_or_refuses_a_plugin_option_as_a_core_one(tmp_path):
    """Plugins' options are saved under ``extra``: one given again on resume is checked as core's are and,
    where it may change (a restarted buffer service's address), applied; it was silently the saved one."""
    from rlsdk.run.output import resumed_settings

    saved = {"num_rollout": 3, "extra": {"rollout_buffer_url": "http://127.0.0.1:1", "rm_url": "http://a"}}
    (tmp_path / "state.json").write_text(json.dumps({"settings": saved}))
    resumed = resumed_settings(tmp_path, {"rollout_buffer_url": "http://127.0.0.1:2"})
    assert resumed["extra"]["rollout_buffer_url"] == "http://127.0.0.1:2"
    with pytest.raises(ValueError, match=r"rm_url \(saved 'http://a', given 'http://b'\)"):
        resumed_settings(tmp_path, {"rm_url": "http://b"})


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
def test_trainer_megatron_is_chosen_by_name_and_says_it_needs_cuda(tiny_llama, run_files, tmp_path, train_args):
    """``--trainer megatron`` reaches rlsdk-megatron's trainer (an installed plugin, by name) after the
    engine starts; on CPU it stops the run with what to use instead, named as the trainer call point names
    a plugin's failure."""
    with pytest.raises(PluginCallError, match="trainer 'megatron' from rlsdk-megatron .*building the trainer raised RuntimeError: rlsdk-megatron trains on CUDA GPUs only: use --trainer torch"):
        run_job(train_args(tiny_llama, run_files, tmp_path / "out", trainer="megatron", num_rollout=1))


# ---------------------------------------------------------------- the newer algorithms (issue 42)


def reward_rise(rows: list[dict]) -> tuple[float, float]:
    """The mean reward of the first three steps and of the last three."""
    start = sum(r["rollout/reward_mean"] for r in rows[:3]) / 3
    end = sum(r["rollout/reward_mean"] for r in rows[-3:]) / 3
    return start, end


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["reinforce", "rloo", "sapo", "ppo"])
def test_the_reward_rises_with_each_estimator(estimator, tiny_llama, run_files, tmp_path, train_args):
    """A reward a quarter of random first tokens earn: each estimator's policy learns to earn it (PPO's
    critic learns its values too: from 0 towards the reward its samples earn). Seeded sampling: the same
    run every time."""
    out = tmp_path / "out"
    options = {"critic_lr": 3e-2, "num_rollout": 14} if estimator == "ppo" else {}
    run_job(train_args(tiny_llama, run_files, out, advantage_estimator=estimator, sglang_enable_deterministic_inference=True, **options))
    rows = metrics(out)
    start, end = reward_rise(rows)
    assert end > start + 0.3, [round(r["rollout/reward_mean"], 3) for r in rows]
    if estimator == "ppo":
        assert all("train/critic_value_loss" in r and "train/critic_explained_variance" in r for r in rows)
        values = [round(r["train/critic_values_mean"], 3) for r in rows]  # the head starts at 0
        assert values[-1] > 0.5 * rows[-1]["rollout/reward_mean"], values
        assert (out / "checkpoints" / f"step_{len(rows) - 1}" / "critic" / "value_model.safetensors").exists()


def teacher_model(tiny_llama: Path, folder: Path) -> Path:
    """The tiny Llama with another output distribution: its embeddings (tied to the output head) re-drawn."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        weight = model.get_input_embeddings().weight
        weight.copy_(torch.randn(weight.shape, generator=generator) * 0.2)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_llama).save_pretrained(folder)
    return folder


ZERO_REWARD = '''
def zero(args, sample, **kwargs):
    return 0.0
'''


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
@pytest.mark.slow
def test_on_policy_distillation_pulls_the_student_to_the_teacher(tiny_llama, tmp_path, train_args):
    """No task reward at all: the reverse KL to a fixed teacher (an embedded engine of another model, by
    name) is the only signal, and it falls. One prompt, so that a few steps see its contexts often (sampled
    freely: deterministic seeds, one per sample index, would make its groups alike). The teacher's logits are
    mild (its embeddings drawn with scale 0.2): a sharper teacher (0.5) put the KL near 10 for a random
    number of steps before it fell, and the test failed about one run in two."""
    teacher = teacher_model(tiny_llama, tmp_path / "teacher")
    data, reward = tmp_path / "one.jsonl", tmp_path / "zero.py"
    data.write_text(json.dumps({"input": "w1 w2 w3"}) + "\n")
    reward.write_text(ZERO_REWARD)
    out = tmp_path / "out"
    run_job(train_args(tiny_llama, (data, f"{reward}:zero"), out, opd_teacher="embedded",
                       opd_teacher_load=str(teacher), opd_kl_coef=1.0, num_rollout=14, lr=5e-2))
    kl = [r["train/opd_reverse_kl"] for r in metrics(out)]
    assert sum(kl[-3:]) / 3 < 0.5 * sum(kl[:3]) / 3, [round(k, 3) for k in kl]


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
def test_an_unknown_teacher_and_a_missing_model_are_refused(tiny_llama, run_files, tmp_path, train_args):
    with pytest.raises(ValueError, match="needs the teacher's model"):
        run_job(train_args(tiny_llama, run_files, tmp_path / "a", opd_teacher="embedded", num_rollout=1))
    with pytest.raises(Exception, match="nosuchengine"):
        run_job(train_args(tiny_llama, run_files, tmp_path / "b", opd_teacher="nosuchengine",
                           opd_teacher_load=str(tiny_llama), num_rollout=1))




def sharper_llama(tiny_llama: Path, folder: Path) -> Path:
    """The tiny Llama with its (tied) embeddings ten times larger. The tiny one's are so small (std 0.02) that
    no change of its layers moves a token's logit by more than about one nat: only training the embeddings
    themselves can, and LoRA leaves them alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(10.0)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_llama).save_pretrained(folder)
    return folder


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
@pytest.mark.slow
def test_lora_learns_syncs_its_adapter_and_checkpoints_it_alone(tiny_llama, run_files, tmp_path, train_args):
    """Only the adapter trains and travels: the embedded engine merges it in process and the trust check
    passes on every step; the checkpoint holds the adapter and no model weights."""
    out = tmp_path / "out"
    model = sharper_llama(tiny_llama, tmp_path / "sharper")
    run_job(train_args(model, run_files, out, lora_rank=8, lr=5e-2, num_rollout=14, sglang_enable_deterministic_inference=True))
    rows = metrics(out)
    start, end = reward_rise(rows)
    assert end > start + 0.3, [round(r["rollout/reward_mean"], 3) for r in rows]
    assert all(r["train/sync_logprob_max_diff"] < 1e-3 for r in rows)
    last = out / "checkpoints" / f"step_{len(rows) - 1}"
    assert (last / "adapter_model.safetensors").exists() and (last / "adapter_config.json").exists()
    assert not (last / "model.safetensors").exists()
    versions = [json.loads(line)["weight_versions"] for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert versions[-1] == [str(len(rows) - 1)]


class ForgetfulEngine:
    """The embedded engine with one fault: it accepts a LoRA adapter and never applies it."""

    @hookimpl
    def rlsdk_engines(self):
        from rlsdk import Engine

        def forgetful(args):
            from rlsdk_embedded.engine import EmbeddedEngine

            class Forgetful(EmbeddedEngine):
                def _merge_adapter(self, deltas):
                    pass

            return Forgetful(args.model, device="cpu", threads=1)

        yield Engine(name="forgetful", func=forgetful)


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
def test_the_trust_check_catches_an_adapter_the_engine_did_not_apply(tiny_llama, run_files, tmp_path, train_args):
    pm = get_plugin_manager(plugins=[ForgetfulEngine()])
    args = train_args(tiny_llama, run_files, tmp_path / "out", engine="forgetful", lora_rank=8, lr=5e-2,
                      num_rollout=2)
    with pytest.raises(WeightSyncError, match="serving other weights than the trainer's"):
        run_job(args, pm)


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
def test_an_engine_over_http_loads_each_adapter_through_the_lora_endpoints(tiny_llama, run_files, tmp_path, train_args):
    """SGLang's LoRA protocol against ``rlsdk serve``'s server (SGLang needs a GPU): the trainer writes each
    version's adapter folder, the client loads it (``/load_lora_adapter``), unloads the one before, sets the
    weight version and names the adapter in every ``/generate`` (the trust check's too)."""
    from rlsdk.testing import ServedEngine
    from rlsdk_embedded.engine import EmbeddedEngine

    out = tmp_path / "out"
    with ServedEngine(EmbeddedEngine(str(tiny_llama), device="cpu", threads=1), weights_dirs=[out]) as served:
        run_job(train_args(tiny_llama, run_files, out, engine=served.url, hf_checkpoint=str(tiny_llama),
                           lora_rank=8, lr=5e-2, num_rollout=2))
        engine = served.engine
        assert engine.lora_name == "rlsdk_v2" and list(engine.lora_adapters) == ["rlsdk_v2"]
        assert served.run(engine.model_info())["weight_version"] == "2"
    rows = metrics(out)
    assert all(r["train/sync_logprob_max_diff"] < 1e-3 for r in rows)
    assert sorted(p.name for p in (out / "sync-weights").iterdir()) == ["rlsdk_v2"]  # v1's folder went with it
