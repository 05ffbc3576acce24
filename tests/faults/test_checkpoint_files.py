"""Files a run saved and reads back on ``--resume`` (T14, T13, T12, D6): nothing in a checkpoint is ever
executed, and a damaged file is an error naming it, not a traceback. The trainer is the real ``torch``
trainer on the tiny Llama (``tiny_llama`` in tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from rlsdk import RolloutConfig, get_plugin_manager
from rlsdk.errors import CheckpointError
from rlsdk.run.output import RunOutput, resumed_settings


class RunsCode:
    """What an attacker puts in a pickle: loading it calls ``open(marker, "w")``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def trainer(tiny_llama):
    args = RolloutConfig(hf_checkpoint=str(tiny_llama), lr=1e-3, train_threads=1)
    trainer = get_plugin_manager().resolve("trainer", "torch").func(args)
    yield trainer
    trainer.close()


def test_a_pickle_in_the_checkpoint_is_refused_never_run(trainer, tmp_path):
    folder = tmp_path / "step_0"
    folder.mkdir()
    trainer.save_checkpoint(folder)
    marker = tmp_path / "code-ran"
    torch.save({"torch": RunsCode(marker), "python": None, "cuda": None}, folder / "rng.pt")
    with pytest.raises(CheckpointError, match=r"rng\.pt cannot be loaded safely"):
        trainer.load_checkpoint(folder)
    assert not marker.exists()


@pytest.mark.parametrize("name", ["optimizer.pt", "rng.pt", "model.safetensors"])
def test_a_damaged_checkpoint_file_is_named(trainer, tmp_path, name):
    folder = tmp_path / "step_0"
    folder.mkdir()
    trainer.save_checkpoint(folder)
    data = (folder / name).read_bytes()
    (folder / name).write_bytes(data[: len(data) // 3])  # cut by a full disk or a copy that stopped
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
        trainer.load_checkpoint(folder)


def test_a_damaged_state_file_is_named(tmp_path):
    (tmp_path / "state.json").write_text('{"next_rollout_id": 3, "file_si')
    with pytest.raises(CheckpointError, match=r"state\.json cannot be read"):
        RunOutput(tmp_path).load_state()
    with pytest.raises(CheckpointError, match=r"state\.json"):
        resumed_settings(tmp_path, {})
    (tmp_path / "state.json").write_text("[]")
    with pytest.raises(CheckpointError, match=r"state\.json is damaged or not written by rlsdk"):
        RunOutput(tmp_path).load_state()


def test_resume_on_a_damaged_state_and_an_output_file_are_one_line_errors(tmp_path):
    rlsdk = [sys.executable, "-c", "from rlsdk_cli.app import main; main()", "run"]
    (tmp_path / "state.json").write_text("{not json")
    resumed = subprocess.run([*rlsdk, "--resume", "--output", str(tmp_path)], capture_output=True, text=True)
    assert resumed.returncode == 1 and "state.json cannot be read" in resumed.stderr + resumed.stdout
    assert "Traceback" not in resumed.stderr
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    fresh = subprocess.run(
        [*rlsdk, "--output", str(a_file), "--num-rollout", "1"], capture_output=True, text=True
    )
    out = fresh.stderr + fresh.stdout
    assert fresh.returncode == 1 and "is a file, not a folder" in out and "Traceback" not in out
