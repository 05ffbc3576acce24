"""The trust check that misses nothing and cries wolf never, on CPU with the tiny Llama (``tiny_llama`` in
tests/conftest.py, and a 3-layer one here), the embedded engine and the torch trainer (T21, issue 45):

- the weights check (``weights_check``: every tensor the engine holds against the trainer's, by
  checksum) names any one tensor a sync left at its old value, at whichever position (the embeddings, the
  first, a middle and the last layer, the final norm), at the first sync; a correct sync passes it, and
  then log-prob gaps over the tolerance stop nothing (they are numeric noise);
- without it (the default on CPU), a sync that leaves one tensor at its old value is caught by the mean
  per-token gap against the run's own noise at every position too, even with the loose max-gap tolerance
  CUDA needs (``sync_check_tol=2``, where the max gap alone lets it through);
- a correct sync is not flagged;
- an engine that lost the trainer's weights since the last sync (restarted: it serves ``default``) is
  noticed by the weight-version handshake and synced again before it generates;
- all of it in ``--async`` runs too, whose syncs happen between rollout steps of their own thread.

The GPU measurements (SGLang in bfloat16) are in benchmarks/gpu/trust_gpu.py and docs/faults.md."""

from __future__ import annotations

import json
import shutil

import pytest

from rlsdk import Trainer, get_plugin_manager, hookimpl
from rlsdk.run.job import run_job
from rlsdk.training.sync import WeightSyncError

pytestmark = pytest.mark.plugins("rlsdk_embedded")

POSITIONS = {
    "embeddings": "model.embed_tokens.weight",
    "first": "model.layers.0.self_attn.v_proj.weight",
    "middle": "model.layers.1.mlp.up_proj.weight",
    "last": "model.layers.2.mlp.down_proj.weight",
    "final_norm": "model.norm.weight",
}
"""One tensor of each position in the 3-layer Llama; the fused ones (v_proj, up_proj) are held inside
SGLang's ``qkv_proj`` and ``gate_up_proj``."""


@pytest.fixture(scope="module")
def three_layers(tiny_llama, tmp_path_factory):
    """The tiny Llama's tokenizer and shape with 3 layers (random weights): a first, a middle, a last."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("three-layers")
    shutil.copytree(tiny_llama, folder, dirs_exist_ok=True)
    config = LlamaConfig.from_pretrained(tiny_llama)
    config.num_hidden_layers = 3
    torch.manual_seed(1)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


class PartialSync:
    """Torch trainers whose weights for the engine keep one tensor (and the names tied to it: the output
    head shares the embeddings) at its starting value: a sync that skipped it (``skip_first_layer``,
    ``skip_last_layer`` in the 2-layer Llama; ``skip`` for ``name``)."""

    def __init__(self, name: str = "") -> None:
        self.name = name

    @hookimpl
    def rlsdk_trainers(self):
        def skipping(name):
            def build(args):
                from rlsdk.training.torch_trainer import TorchTrainer

                class Skipping(TorchTrainer):
                    def __init__(self, args):
                        super().__init__(args)
                        state = self.model.state_dict()
                        self.stale = state[name].detach().clone()
                        self.tied = [n for n, t in state.items() if t.data_ptr() == state[name].data_ptr()]

                    def weights(self):
                        return {**super().weights(), **dict.fromkeys(self.tied, self.stale)}

                return Skipping(args)

            return build

        yield Trainer(name="skip_first_layer", func=skipping("model.layers.0.self_attn.v_proj.weight"))
        yield Trainer(name="skip_last_layer", func=skipping("model.layers.1.mlp.down_proj.weight"))
        if self.name:
            yield Trainer(name="skip", func=skipping(self.name))


@pytest.fixture
def args(tiny_run):
    def make(**options):
        values = {
            "lr": 1e-2,
            "rollout_batch_size": 4,
            "n_samples_per_prompt": 4,
            "rollout_max_response_len": 4,
            "num_rollout": 3,
            "sync_check_tol": 2.0,  # CUDA's loose max-gap tolerance: the drift check must do the work
        }
        return tiny_run(**{**values, **options})

    return make


def rows(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("train_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("trainer", ["skip_first_layer", "skip_last_layer"])
def test_a_sync_that_skips_one_tensor_is_caught(args, trainer, train_async):
    with pytest.raises(WeightSyncError, match="part of the weights did not reach the engine"):
        run_job(args(trainer=trainer, train_async=train_async), get_plugin_manager(plugins=[PartialSync()]))


@pytest.mark.parametrize("position", POSITIONS)
def test_the_weights_check_names_a_tensor_a_sync_left_stale_at_any_position(args, three_layers, position):
    """With the weights check the loose log-prob tolerance does not matter: the checksums differ. Seeded
    (``--deterministic``): a step 0 whose every group got equal rewards trains nothing, and the stale tensor
    would then first differ at sync 2."""
    name = POSITIONS[position]
    config = args(model=str(three_layers), trainer="skip", weights_check="on", sglang_enable_deterministic_inference=True)
    with pytest.raises(
        WeightSyncError, match=r"after weight sync 1: the embedded engine holds other"
    ) as caught:
        run_job(config, get_plugin_manager(plugins=[PartialSync(name)]))
    assert "1 of 29 tensors" in str(caught.value) and name in str(caught.value)


@pytest.mark.parametrize("position", POSITIONS)
def test_the_float32_drift_check_catches_a_tensor_left_stale_at_any_position(args, three_layers, position):
    config = args(model=str(three_layers), trainer="skip", weights_check="off")
    with pytest.raises(WeightSyncError, match="x this run's own noise"):
        run_job(config, get_plugin_manager(plugins=[PartialSync(POSITIONS[position])]))


@pytest.mark.parametrize("train_async", [False, True], ids=["sync", "async"])
def test_a_correct_sync_passes_the_weights_check_and_then_log_prob_gaps_stop_nothing(
    args, tmp_path, three_layers, train_async
):
    """A tolerance no two implementations meet (1e-12 nats) would stop the run at the first sync; with
    every tensor verified by checksum, the gaps are numeric noise and the run goes on."""
    run_job(
        args(
            model=str(three_layers),
            weights_check="on",
            sync_check_tol=1e-12,
            num_rollout=3,
            train_async=train_async,
        )
    )
    metrics = rows(tmp_path / "out")
    checked = [row for row in metrics if "train/weights_checked" in row]
    assert len(checked) >= 2
    assert all(row["train/weights_checked"] == 29 for row in checked)  # 1 + 3 x 9 + 1; lm_head is tied
    assert any(row["train/sync_logprob_max_diff"] > 1e-12 for row in checked)  # would have stopped the run


@pytest.mark.parametrize("train_async", [False, True], ids=["sync", "async"])
def test_a_correct_sync_is_not_flagged(args, tmp_path, train_async):
    run_job(args(num_rollout=4, train_async=train_async))
    metrics = rows(tmp_path / "out")
    assert len(metrics) == 4
    checked = [row for row in metrics if "train/sync_logprob_mean_diff" in row]
    assert len(checked) >= 3  # async: step 0's batch is recorded before any sync
    for row in checked:
        assert row["train/sync_logprob_mean_diff"] <= max(4 * row["train/sync_logprob_noise"], 1e-4)
        assert row["train/sync_logprob_max_diff"] < 1e-3


def test_an_engine_that_lost_the_weights_is_synced_again_before_it_generates(
    args, tmp_path, tiny_llama, monkeypatch
):
    """After step 0's sync the engine goes back to its starting weights (as a restarted one does); step 1
    must not sample from them."""
    from contextlib import contextmanager

    from rlsdk.run import job

    config = args(num_rollout=2, sync_check_tol=1e-3)
    runtimes, running = [], job.running

    @contextmanager
    def kept_running(*a, **kw):  # the run's runtime, for the callback below
        with running(*a, **kw) as runtime:
            runtimes.append(runtime)
            yield runtime

    monkeypatch.setattr(job, "running", kept_running)

    def restart_engine(rollout_id, metrics):
        if rollout_id == 0:
            runtime = runtimes[0]
            runtime.run(runtime.engine.update_weights_from_disk(str(tiny_llama), "default"))

    run_job(config, on_step=restart_engine)
    samples = [json.loads(line) for line in (tmp_path / "out" / "rollouts.jsonl").read_text().splitlines()]
    assert {tuple(s["weight_versions"]) for s in samples if s["rollout_id"] == 1} == {("1",)}
    assert rows(tmp_path / "out")[1]["train/engine_resyncs"] == 1


def test_an_async_run_syncs_an_engine_that_lost_the_weights_before_it_generates(
    args, tmp_path, tiny_llama, monkeypatch
):
    """Right after the first sync and its trust check, the engine goes back to its starting weights (as a
    restarted one does). In ``--async`` the rollout thread must notice before its next step generates,
    so that no sample comes from weights other than those the step records."""
    from rlsdk.training.session import TrainingSession

    check, restarted = TrainingSession.check, []

    def check_then_restart(self, probe, probes=None):
        metrics = check(self, probe, probes)
        if not restarted:
            restarted.append(self.weight_version)
            self.runtime.run(self.runtime.engine.update_weights_from_disk(str(tiny_llama), "default"))
        return metrics

    monkeypatch.setattr(TrainingSession, "check", check_then_restart)
    run_job(args(num_rollout=4, train_async=True, sync_check_tol=1e-3))
    samples = [json.loads(line) for line in (tmp_path / "out" / "rollouts.jsonl").read_text().splitlines()]
    after = {s["rollout_id"] for s in samples if "default" not in s["weight_versions"]}
    assert restarted == [1] and after  # steps sampled after the first sync
    assert all("default" not in s["weight_versions"] for s in samples if s["rollout_id"] >= min(after))
    assert sum(row.get("train/engine_resyncs", 0) for row in rows(tmp_path / "out")) == 1
