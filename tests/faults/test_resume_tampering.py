"""The run folder is untrusted input on ``--resume``: a tampered ``state.json``, checkpoint, adapter or
base model, and a run folder copied from another machine. Real ``rlsdk run`` subprocesses against the
misbehaving engine of conftest (an HTTP server on loopback speaking SGLang's ``/generate``), and in-process
training runs on the tiny Llama (``tiny_run``) where a checkpoint is needed.

Before: ``--resume`` truncated or created any file ``state.json`` named (absolute or ``..``), imported a
``.py`` file its settings named, loaded checkpoint files another run had overwritten, took a LoRA adapter
missing half its tensors and a base model changed in place, and left the loggers' rows of the steps it
runs again in place (steps logged twice)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlsdk import RolloutConfig
from rlsdk.errors import CheckpointError, RlsdkError
from rlsdk.run.job import run_job

from .conftest import rlsdk_run, run_options

EVIL = "import pathlib\npathlib.Path({marker!r}).write_text('ran')\ndef fn(args, sample, **kw):\n    return 1.0\n"


def state_of(out):
    return json.loads((out / "state.json").read_text())


def tamper(out, change):
    state = state_of(out)
    change(state)
    (out / "state.json").write_text(json.dumps(state))


@pytest.fixture
def run_folder(misbehaving_engine, word_tokenizer, data, tmp_path):
    """``run_folder(*options, env=...)``: the output folder of a finished one-step ``rlsdk run``, and the
    options that resume it (``--output`` and ``--num-rollout 2``)."""

    def make(*more, env=None):
        out = tmp_path / "run"
        options = run_options(misbehaving_engine.url, word_tokenizer, data, out, "--num-rollout", "1", *more)
        done = rlsdk_run(*options, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        return out

    return make


def resume(out, *more, env=None):
    done = rlsdk_run("--resume", "--output", str(out), "--num-rollout", "2", *more, env=env)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.plugins("rlsdk_rm_hub")  # the f1 reward
def test_file_sizes_naming_files_outside_the_run_folder_are_refused(run_folder, tmp_path):
    out = run_folder()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    created = tmp_path / "created.txt"
    for name in (str(victim), "../victim.txt", "logs/../../created.txt"):
        tamper(out, lambda state, name=name: state["file_sizes"].update({name: 0}))
        code, output = resume(out)
        assert code == 1 and "file_sizes" in output and name in output and "Traceback" not in output, output
        assert victim.read_text() == "precious" and not created.exists()
        tamper(out, lambda state, name=name: state["file_sizes"].pop(name))


@pytest.mark.plugins("rlsdk_rm_hub")  # the f1 reward
@pytest.mark.parametrize("where", ["settings", "buffer"])
def test_code_a_tampered_state_names_is_never_imported(run_folder, tmp_path, where):
    """The state names a ``.py`` file the attacker put in the run folder: as the reward setting, or as the
    ``custom_rm_path`` of a sample in the saved buffer (served first on resume)."""
    out = run_folder()
    marker = tmp_path / "code-ran"
    (out / "evil.py").write_text(EVIL.format(marker=str(marker)))
    spec = f"{out / 'evil.py'}:fn"

    def name_the_code(state):
        if where == "settings":
            state["settings"]["rm_type"] = spec
        else:
            row = json.loads((out / "rollouts.jsonl").read_text().splitlines()[0])
            sample = {k: v for k, v in row.items() if k != "rollout_id"}
            sample.update(reward=None, custom_rm_path=spec)  # scored again, by the code it names
            state["data"]["buffer"] = [[sample, {**sample, "index": sample["index"] + 1}]]

    tamper(out, name_the_code)
    code, output = resume(out)
    assert code == 1, output
    assert "not written by rlsdk on this machine" in output and "evil.py" in output, output
    assert not marker.exists()


def test_a_run_folder_copied_from_another_machine_resumes_what_it_can_verify(run_folder, tmp_path):
    """Each machine's rlsdk signs the states it writes with a key of its own ($XDG_STATE_HOME/rlsdk): a
    copy resumed elsewhere is told so, and loads code only where the command line names it again."""
    reward = tmp_path / "reward.py"
    reward.write_text("def fn(args, sample, **kw):\n    return 1.0\n")
    machine_a = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "machine-a")}
    machine_b = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "machine-b")}
    out = run_folder("--rm-type", f"{reward}:fn", env=machine_a)
    code, output = resume(out, env=machine_b)
    assert code == 1, output
    assert "not written by rlsdk on this machine" in output and "rm_type" in output, output
    code, output = resume(out, "--rm-type", f"{reward}:fn", env=machine_b)
    assert code == 0, output
    assert "not written by rlsdk on this machine" in output  # said on the terminal
    assert [json.loads(r)["rollout_id"] for r in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    code, output = resume(out, "--num-rollout", "3", env=machine_b)  # signed here now: nothing to say
    assert code == 0 and "not written by rlsdk on this machine" not in output, output


@pytest.mark.plugins("rlsdk_rm_hub")  # the f1 reward
def test_logger_rows_of_the_steps_run_again_are_rolled_back(
    misbehaving_engine, word_tokenizer, data, tmp_path
):
    """A crash after a step was logged and before its state was saved: on ``--resume`` the step runs
    again, and its first rows in ``logs/`` are cut off as ``rollouts.jsonl``'s are."""
    out = tmp_path / "out"

    def run(num_rollout, resume=False):
        settings = {
            "engine": misbehaving_engine.url,
            "hf_checkpoint": word_tokenizer,
            "prompt_data": str(data),
            "rm_type": "f1",
            "label_key": "label",
            "rollout_batch_size": 2,
            "n_samples_per_prompt": 2,
            "num_rollout": num_rollout,
            "output_dir": str(out),
            "custom_rollout_log_function_path": "jsonl",
            "eval_interval": 1,
            "custom_eval_rollout_log_function_path": "jsonl",
            "resume": resume,
        }
        run_job(RolloutConfig.from_dict(settings))

    run(1)
    after_step_0 = (out / "state.json").read_text()
    run(2, resume=True)
    (out / "state.json").write_text(after_step_0)  # step 1 was logged, its state never saved
    run(2, resume=True)
    for name in ("rollout_log.jsonl", "eval_rollout_log.jsonl"):
        rows = [json.loads(r) for r in (out / "logs" / name).read_text().splitlines()]
        assert [r["rollout_id"] for r in rows] == [0, 1], name


# ----- checkpoints --------------------------------------------------------------------------------------


def perturb(path):
    """Rewrite a safetensors file with every tensor changed a little: a valid file of other weights."""
    tensors = {name: t + 0.01 for name, t in load_file(str(path)).items()}
    save_file(tensors, str(path), metadata={"format": "pt"})


@pytest.mark.plugins("rlsdk_embedded")
def test_a_checkpoint_file_changed_since_it_was_saved_is_refused(tiny_run, tmp_path):
    out = tmp_path / "out"
    run_job(tiny_run(output_dir=str(out), num_rollout=1, save_interval=1))
    perturb(out / "checkpoints" / "step_0" / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"step_0/model\.safetensors changed since it was saved"):
        run_job(tiny_run(output_dir=str(out), num_rollout=2, resume=True))
    shutil.rmtree(out / "checkpoints" / "step_0" / "critic", ignore_errors=True)
    (out / "checkpoints" / "step_0" / "extra.py").write_text("x = 1\n")
    with pytest.raises(CheckpointError, match=r"extra\.py"):
        run_job(tiny_run(output_dir=str(out), num_rollout=2, resume=True))


@pytest.mark.plugins("rlsdk_embedded")
def test_a_checkpoint_path_outside_the_run_s_folders_is_refused(tiny_run, tmp_path):
    out = tmp_path / "out"
    run_job(tiny_run(output_dir=str(out), num_rollout=1, save_interval=1))
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(out / "checkpoints" / "step_0", elsewhere)
    for named in (str(elsewhere), "../elsewhere"):
        tamper(out, lambda state, named=named: state.update(checkpoint=named))
        with pytest.raises(CheckpointError, match="outside"):
            run_job(tiny_run(output_dir=str(out), num_rollout=2, resume=True))


@pytest.mark.plugins("rlsdk_embedded")
def test_a_run_does_not_resume_from_weights_another_run_wrote_to_its_save_folder(tiny_run, tmp_path):
    """Two runs sharing ``--save`` one after the other (the lock stops them at the same time): the second
    overwrote ``step_0``; the first notices on resume instead of training on on the other's weights."""
    save = tmp_path / "shared-checkpoints"
    first, second = tmp_path / "first", tmp_path / "second"
    run_job(tiny_run(output_dir=str(first), save=str(save), num_rollout=1, save_interval=1))
    run_job(
        tiny_run(
            output_dir=str(second), save=str(save), num_rollout=1, save_interval=1, rollout_seed=7, lr=0.1
        )
    )
    with pytest.raises(CheckpointError, match="changed since it was saved"):
        run_job(tiny_run(output_dir=str(first), save=str(save), num_rollout=2, resume=True))


@pytest.mark.plugins("rlsdk_embedded")
def test_a_lora_adapter_missing_tensors_is_refused(tiny_run, tmp_path):
    out = tmp_path / "out"
    run_job(tiny_run(output_dir=str(out), num_rollout=1, save_interval=1, lora_rank=4))
    adapter = out / "checkpoints" / "step_0" / "adapter_model.safetensors"
    tensors = load_file(str(adapter))
    kept = dict(sorted(tensors.items())[: len(tensors) // 2])
    save_file(kept, str(adapter), metadata={"format": "pt"})
    tamper(
        out, lambda state: state.pop("checkpoint_files", None)
    )  # past the fingerprints: the loader checks too
    with pytest.raises(CheckpointError, match="misses .* of the model's adapter tensors"):
        run_job(tiny_run(output_dir=str(out), num_rollout=2, resume=True, lora_rank=4))


@pytest.mark.plugins("rlsdk_embedded")
def test_a_base_model_changed_in_place_is_noticed_on_a_lora_resume(tiny_run, tiny_llama, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_llama, model)
    out = tmp_path / "out"
    run_job(tiny_run(model=str(model), output_dir=str(out), num_rollout=1, save_interval=1, lora_rank=4))
    perturb(model / "model.safetensors")
    with pytest.raises(RlsdkError, match="the base model .*model changed since the run was saved"):
        run_job(tiny_run(model=str(model), output_dir=str(out), num_rollout=2, resume=True, lora_rank=4))


def test_the_critic_s_optimizer_is_loaded_without_running_a_pickle(tiny_llama, tmp_path, monkeypatch):
    """torch's opt-out variable makes a plain ``torch.load`` unpickle anything; an explicit
    ``weights_only=True`` ignores it."""
    from rlsdk import get_plugin_manager

    from .test_checkpoint_files import RunsCode

    args = RolloutConfig(hf_checkpoint=str(tiny_llama), lr=1e-3, train_threads=1, advantage_estimator="ppo")
    trainer = get_plugin_manager().resolve("trainer", "torch").func(args)
    try:
        folder = tmp_path / "step_0"
        folder.mkdir()
        trainer.save_checkpoint(folder)
        marker = tmp_path / "code-ran"
        torch.save({"state": RunsCode(marker)}, folder / "critic" / "optimizer.pt")
        monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
        with pytest.raises(CheckpointError, match=r"critic/optimizer\.pt cannot be loaded safely"):
            trainer.load_checkpoint(folder)
        assert not marker.exists()
    finally:
        trainer.close()


@pytest.mark.plugins("rlsdk_embedded")
def test_rlsdk_eval_of_a_checkpoint_with_tampered_settings_imports_no_code(tiny_run, tmp_path):
    """``rlsdk eval --model CHECKPOINT`` takes the reward and data settings of the run that wrote it; from a
    checkpoint this machine did not write, none of them loads code (before: its ``rm_type`` was imported)."""
    out = tmp_path / "out"
    run_job(tiny_run(output_dir=str(out), num_rollout=1, save_interval=1))
    checkpoint = out / "checkpoints" / "step_0"
    marker = tmp_path / "code-ran"
    (checkpoint / "evil.py").write_text(EVIL.format(marker=str(marker)))
    meta = json.loads((checkpoint / "rlsdk_checkpoint.json").read_text())
    meta["settings"]["rm_type"] = f"{checkpoint / 'evil.py'}:fn"
    (checkpoint / "rlsdk_checkpoint.json").write_text(json.dumps(meta))
    done = rlsdk_run("--model", str(checkpoint), "--engine-threads", "1", command="eval")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "not written by rlsdk on this machine" in output and "rm_type" in output and "Traceback" not in output
    assert not marker.exists()
