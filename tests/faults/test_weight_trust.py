"""The trust check that misses nothing and cries wolf never, on CPU with the tiny Llama (``tiny_llama`` in
tests/conftest.py), the embedded engine and the torch trainer (T21, issue item 3):

- a sync that leaves one tensor of the first layer, or of the last layer, at its old value is caught by
  the mean per-token gap against the run's own noise, even with the loose max-gap tolerance CUDA needs
  (``sync_check_tol=2``, where the max gap alone lets it through);
- a correct sync is not flagged;
- an engine that lost the trainer's weights since the last sync (restarted: it serves ``default``) is
  noticed by the weight-version handshake and synced again before it generates;
- all of it in ``--async`` runs too, whose syncs happen between rollout steps of their own thread.

The GPU measurement (SGLang in bfloat16, 80 steps) is not here: it needs the device (see docs/faults.md)."""

from __future__ import annotations

import json

import pytest

from rlsdk import Trainer, get_plugin_manager, hookimpl
from rlsdk.run.job import run_job
from rlsdk.training.sync import WeightSyncError

pytestmark = pytest.mark.plugins("rlsdk_embedded")


class PartialSync:
    """Torch trainers whose weights for the engine keep one tensor at its starting value: a sync that
    skipped it."""

    @hookimpl
    def rlsdk_trainers(self):
        def skipping(name):
            def build(args):
                from rlsdk.training.torch_trainer import TorchTrainer

                class Skipping(TorchTrainer):
                    def __init__(self, args):
                        super().__init__(args)
                        self.stale = self.model.state_dict()[name].detach().clone()

                    def weights(self):
                        return {**super().weights(), name: self.stale}

                return Skipping(args)

            return build

        yield Trainer(name="skip_first_layer", func=skipping("model.layers.0.self_attn.v_proj.weight"))
        yield Trainer(name="skip_last_layer", func=skipping("model.layers.1.mlp.down_proj.weight"))


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


def test_an_engine_that_lost_the_weights_is_synced_again_before_it_generates(args, tmp_path, tiny_llama):
    """After step 0's sync the engine goes back to its starting weights (as a restarted one does); step 1
    must not sample from them."""
    from rlsdk.runtime import get_runtime

    config = args(num_rollout=2, sync_check_tol=1e-3)

    def restart_engine(rollout_id, metrics):
        if rollout_id == 0:
            runtime = get_runtime(config)
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
