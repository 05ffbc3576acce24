"""Core's logging backends (``--rollout-log`` / ``--eval-rollout-log``: ``jsonl``, ``tensorboard``, ``wandb``),
each through its kind's call point (rlsdk.testing's checks), writing real files under the run's folder."""

from __future__ import annotations

import json
import os

import pytest

from rlsdk import RolloutConfig, get_plugin_manager
from rlsdk.testing import check_eval_rollout_log, check_rollout_log


@pytest.fixture
def core_pm():
    return get_plugin_manager(load_entrypoints=False)


def test_jsonl_writes_one_line_per_step_and_eval(core_pm, tmp_path):
    args = RolloutConfig(output_dir=str(tmp_path))
    assert check_rollout_log(core_pm, "jsonl", args) is False
    assert check_eval_rollout_log(core_pm, "jsonl", args) is False
    step = json.loads((tmp_path / "logs/rollout_log.jsonl").read_text())
    assert step["metrics"] == {"rollout/reward_mean": 0.5, "rollout/samples": 2.0} and len(step["samples"]) == 2
    assert json.loads((tmp_path / "logs/eval_rollout_log.jsonl").read_text())["rewards"] == {"held-out": [1.0, 0.0]}


def test_tensorboard_writes_scalars_tensorboard_reads(core_pm, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = RolloutConfig(output_dir=str(tmp_path))
    check_rollout_log(core_pm, "tensorboard", args)
    check_eval_rollout_log(core_pm, "tensorboard", args)
    events = EventAccumulator(str(tmp_path / "logs/tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"rollout/reward_mean", "rollout/rollout_time", "eval/held-out/reward_mean"} <= set(tags)
    assert events.Scalars("rollout/reward_mean")[0].value == 0.5


def test_wandb_logs_offline_into_the_run_folder(core_pm, tmp_path, monkeypatch):
    pytest.importorskip("wandb")  # the optional extra rlsdk[wandb]
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    args = RolloutConfig(output_dir=str(tmp_path))
    check_rollout_log(core_pm, "wandb", args)
    runs = [p for p in os.listdir(tmp_path / "logs/wandb") if p.startswith("offline-run-")]
    assert len(runs) == 1 and any(f.endswith(".wandb") for f in os.listdir(tmp_path / "logs/wandb" / runs[0]))
