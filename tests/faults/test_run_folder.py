"""The output folder across runs and resumes (T20, T19, T18, T16): ``rlsdk run`` on the tiny Llama
(``tiny_llama`` in tests/conftest.py) in the embedded engine with the torch trainer, in process and as a
real second process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest

from rlsdk.errors import RlsdkError
from rlsdk.run.job import run_job
from rlsdk.run.folder import folder_lock

pytestmark = pytest.mark.plugins("rlsdk_embedded")

RLSDK = [sys.executable, "-c", "from rlsdk_cli.app import main; main()"]


@pytest.fixture
def run(tiny_run):
    """``run(out, **options)``: a training run of ``num_rollout`` steps on 16 prompts."""

    def start(out, **options):
        return run_job(tiny_run(output_dir=str(out), **options))

    start.data = tiny_run.data
    return start


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_second_run_on_a_folder_in_use_fails_at_once_naming_the_pid(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    data = tmp_path / "rows.jsonl"
    data.write_text('{"input": "w1"}\n')
    saved = {"settings": {"prompt_data": str(data)}, "file_sizes": {}, "data": {}, "next_rollout_id": 0}
    (out / "state.json").write_text(json.dumps(saved))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from rlsdk.run.folder import folder_lock\nfrom pathlib import Path\n"
            f"import sys, time\nwith folder_lock(Path({str(out)!r})):\n    print('held', flush=True)\n    time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        second = subprocess.run(
            [*RLSDK, "run", "--resume", "--output", str(out)], capture_output=True, text=True, timeout=120
        )
        output = second.stdout + second.stderr
        assert second.returncode == 1, output
        assert f"is in use by another rlsdk run (pid {holder.pid})" in output and "Traceback" not in output
    finally:
        holder.kill()
        holder.wait()
    with folder_lock(out):  # a dead holder's lock is gone with it
        pass


@pytest.mark.parametrize("save", ["own", "the other's output"])
def test_a_second_run_writing_the_checkpoint_folder_of_a_run_fails_at_once(tiny_run, tmp_path, save):
    """Two runs sharing ``--save`` (or one saving into the other's output folder) used to overwrite each
    other's checkpoints, the lock covering ``--output`` only. The first is a real ``rlsdk run --train`` in
    a subprocess, still training."""
    first_out, shared = tmp_path / "first", tmp_path / "checkpoints"
    config = tmp_path / "first.json"
    settings = tiny_run(output_dir=str(first_out), save=str(shared), save_interval=1, num_rollout=10_000)
    config.write_text(
        json.dumps({k: v for k, v in settings.to_dict().items() if k not in ("resume", "overwrite")})
    )
    first = subprocess.Popen(
        [*RLSDK, "run", "--config", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 120
        while not (first_out / "metrics.jsonl").exists():  # a step done: both folders are in use
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read().decode()[-2000:]
            time.sleep(0.2)
        held, role = (shared, "--save") if save == "own" else (first_out, "--output")
        with pytest.raises(RlsdkError) as error:
            run_job(
                tiny_run(output_dir=str(tmp_path / "second"), save=str(held), save_interval=1, num_rollout=1)
            )
        assert f"{held} is in use by another rlsdk run (pid {first.pid}) as its {role} folder" in str(
            error.value
        )
    finally:
        first.kill()
        first.wait()
    assert not (tmp_path / "second" / "state.json").exists()  # refused before anything was written


def test_resume_keeps_the_eval_rows_and_a_moved_run_resumes_from_its_own_checkpoint(run, tmp_path):
    first = tmp_path / "first"
    run(first, eval_interval=1, save_interval=1, num_rollout=2)
    evals = lines(first / "eval.jsonl")
    assert [e["rollout_id"] for e in evals] == [-1, 0, 1]
    state = json.loads((first / "state.json").read_text())
    assert state["checkpoint"] == "checkpoints/step_1"  # relative: the folder can move (T19)
    moved = tmp_path / "moved"
    shutil.copytree(first, moved)
    shutil.rmtree(first)  # the original is gone: the copy must use its own checkpoint
    run(moved, resume=True, eval_interval=1, save_interval=1, num_rollout=3)
    assert [e["rollout_id"] for e in lines(moved / "eval.jsonl")] == [-1, 0, 1, 2]  # T18: step 1's kept
    assert (moved / "checkpoints" / "step_2").is_dir()


def test_a_data_file_changed_in_place_is_noticed_on_resume(run, tmp_path):
    out = tmp_path / "out"
    run(out, num_rollout=1)
    rows = run.data.read_text().splitlines()
    run.data.write_text("\n".join(reversed(rows)) + "\n")  # same rows, other order: other rows at the offsets
    with pytest.raises(RlsdkError, match="the data file .*prompts.jsonl changed since the run was saved"):
        run(out, resume=True, num_rollout=2)
