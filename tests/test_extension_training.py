"""slime's trainer-side extension points as plugin kinds, on the real torch trainer with the tiny Llama of
conftest.py: reward post-processing, training-data post-processing, advantage estimators, the pg-loss reducer
and the TIS function by name; checkpoint callbacks in a real training run."""

from __future__ import annotations

import json

import pytest
import torch

from rlsdk import (
    Advantage,
    CheckpointCallback,
    PgLossReducer,
    RewardPostProcess,
    RolloutConfig,
    RolloutDataPostprocess,
    TisFunction,
    get_plugin_manager,
)
from rlsdk.errors import PluginCallError
from rlsdk.run.job import run_job
from rlsdk.runtime import Runtime, bind_runtime
from rlsdk.testing import FakeEngine, make_train_groups

SEEN: dict[str, list] = {}


def plus_ten(args, samples):
    raw = [s.get_reward_value(args) for s in samples]
    return raw, [r + 10.0 for r in raw]


def mask_first(args, rollout_id, rollout_data):
    SEEN.setdefault("postprocess", []).append(sorted(rollout_data))
    rollout_data["loss_masks"][0] = torch.zeros_like(rollout_data["loss_masks"][0])


def reward_as_advantage(args, rollout_data):
    SEEN.setdefault("advantage", []).append(
        (list(rollout_data["rewards"]), [m.sum().item() for m in rollout_data["loss_masks"]])
    )
    rollout_data["advantages"] = [
        torch.full_like(m, r) for r, m in zip(rollout_data["rewards"], rollout_data["loss_masks"])
    ]
    rollout_data["returns"] = rollout_data["advantages"]


def wrong_advantage(args, rollout_data):
    rollout_data["advantages"] = rollout_data["advantages"] if "advantages" in rollout_data else [1.0]


def token_sum(total_lengths, response_lengths, loss_masks, calculate_per_token_loss):
    SEEN.setdefault("reducer", []).append(list(response_lengths))
    mask = torch.cat(loss_masks)
    return lambda x: (x * mask).sum()


def halve(*, args, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths):
    SEEN.setdefault("tis", []).append(len(train_log_probs))
    return pg_loss * 0.5, loss_masks, {"tis_weight": torch.full_like(pg_loss, 0.5)}


def record_checkpoint(args, rollout_id, path):
    state = json.loads((path.parent.parent / "state.json").read_text())
    SEEN.setdefault("checkpoints", []).append(
        (rollout_id, path.name, (path / "rlsdk_checkpoint.json").exists(), state["checkpoint"])
    )


def breaks(args, rollout_id, path):
    raise OSError("backup disk full")


TRAINING_PLUGINS = [
    RewardPostProcess(name="plus_ten", func=plus_ten),
    RolloutDataPostprocess(name="mask_first", func=mask_first),
    Advantage(name="reward_as_advantage", func=reward_as_advantage),
    Advantage(name="wrong", func=wrong_advantage),
    PgLossReducer(name="token_sum", func=token_sum),
    TisFunction(name="halve", func=halve),
    CheckpointCallback(name="record", func=record_checkpoint),
    CheckpointCallback(name="breaks", func=breaks),
]


@pytest.fixture
def trainer_for(tiny_llama, plugin_of):
    SEEN.clear()
    pm = get_plugin_manager(load_entrypoints=False, plugins=[plugin_of(*TRAINING_PLUGINS)])
    runtimes = []

    def make(**options):
        from rlsdk.trainer_api import TorchTrainer

        args = RolloutConfig(hf_checkpoint=str(tiny_llama), lr=1e-3, train_threads=1, **options)
        engine = FakeEngine([])
        runtimes.append(bind_runtime(args, Runtime(pm, engine, engine.tokenizer)))
        return TorchTrainer(args)

    yield make
    for runtime in runtimes:
        runtime.loop.close()


def test_trainer_side_plugins_by_name_each_called_once_a_step_in_slimes_order(trainer_for):
    trainer = trainer_for(
        custom_reward_post_process_path="plus_ten",
        rollout_data_postprocess_path="mask_first",
        custom_advantage_function_path="reward_as_advantage",
        custom_pg_loss_reducer_function_path="token_sum",
        custom_tis_function_path="halve",
        use_tis=True,
        micro_batch_size=4,
    )
    metrics = trainer.train_step(0, make_train_groups())
    # the post-processed rewards reach the advantage estimator, with the first sample's tokens masked out
    assert SEEN["advantage"] == [([10.0, 11.0, 10.0, 11.0], [0.0, 2.0, 2.0, 2.0])]
    assert {"rewards", "raw_reward", "loss_masks", "tokens", "truncated"} <= set(SEEN["postprocess"][0])
    assert SEEN["reducer"] == [[2, 2, 2, 2]] and SEEN["tis"] == [4]
    assert metrics["train/tis_weight"] == pytest.approx(
        0.5 * 3 / 4
    )  # reduced with the masks (one sample masked)


def test_the_default_trainer_calls_none_of_them(trainer_for):
    trainer_for().train_step(0, make_train_groups())
    assert SEEN == {}


def test_an_advantage_plugin_that_sets_the_wrong_shape_is_named(trainer_for):
    trainer = trainer_for(custom_advantage_function_path="wrong")
    with pytest.raises(PluginCallError, match=r"advantage 'wrong' .* set rollout_data\['advantages'\]"):
        trainer.train_step(0, make_train_groups())


@pytest.mark.slow
@pytest.mark.plugins("rlsdk_embedded")
def test_checkpoint_callbacks_run_after_each_checkpoint_is_complete(tiny_llama, run_files, train_args, plugin_of,
                                                                   tmp_path):
    SEEN.clear()
    pm = get_plugin_manager(plugins=[plugin_of(*TRAINING_PLUGINS)])

    def run(out: str, callback: str) -> RolloutConfig:
        return train_args(tiny_llama, run_files, tmp_path / out, rollout_batch_size=2, n_samples_per_prompt=2,
                          num_rollout=2, save_interval=1, checkpoint_callback=callback)

    run_job(run("a", "record"), pm)
    assert SEEN["checkpoints"] == [
        (0, "step_0", True, "checkpoints/step_0"),
        (1, "step_1", True, "checkpoints/step_1"),
    ]
    with pytest.raises(
        PluginCallError, match=r"checkpoint_callback 'breaks' .* backup disk full .* complete and kept"
    ):
        run_job(run("b", "breaks"), pm)
    assert (tmp_path / "b/checkpoints/step_0/rlsdk_checkpoint.json").exists()
