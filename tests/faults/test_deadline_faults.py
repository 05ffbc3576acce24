"""Deadlines on cross-process waits (issue 48): ``rlsdk run`` in a subprocess against a real peer that stalls (an
engine on loopback that accepts requests and never answers, a reward in the run's own process that never
returns). Each case ends (no hang: ``rlsdk_run``'s 120 s limit) with exit 1, a one-line cause naming what was
waited for, for how long and the option (so it was the deadline that fired, not a default), and a ledger that
balances. Deadlines are short (3 s) so that the suite stays fast. How long after the peer went silent each run
ended is measured, not asserted here (docs/faults.md, "Deadlines on cross-process waits")."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from .conftest import FAST_RETRIES, RLSDK, buffer_item, buffer_run_inputs, rlsdk_run, run_options

DEADLINE = 3.0
RAY_DEADLINE = 8.0
"""The Ray trainer's: stopping the local cluster a run started adds 2 to 5 s to any deadline (docs/faults.md)."""


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def one_line_cause(output: str) -> str:
    """The error line the run ends with (``Error: ...``); no traceback."""
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.lower().startswith("error")]
    assert errors, output
    return errors[-1]


def run_silent(engine, mode: str, tokenizer: Path, data: Path, folder: Path):
    """``rlsdk run`` against the misbehaving ``engine`` in ``mode`` with a generation deadline of
    :data:`DEADLINE`: its result, its one-line cause and its output folder."""
    engine.mode = mode
    out = folder / "run"
    result = rlsdk_run(*run_options(engine.url, tokenizer, data, out, "--generate-timeout", str(DEADLINE)))
    return result, one_line_cause(result.stdout + result.stderr), out


@pytest.mark.plugins("rlsdk_rm_hub")
def test_an_engine_that_accepts_and_never_answers_stops_the_run_at_its_health_check(
    misbehaving_engine, word_tokenizer, data, tmp_path
):
    result, cause, out = run_silent(misbehaving_engine, "silent", word_tokenizer, data, tmp_path)
    assert result.returncode == 1
    assert f"at {misbehaving_engine.url} failed its health check" in cause
    assert "no answer to a one-token generation within 3s (generate_timeout)" in cause
    assert "no step ran, no data was used" in cause
    assert not (out / "state.json").exists()


@pytest.mark.plugins("rlsdk_rm_hub")
def test_an_engine_that_goes_silent_after_its_health_check_fails_the_step_and_loses_no_prompt(
    misbehaving_engine, word_tokenizer, data, tmp_path
):
    result, cause, out = run_silent(misbehaving_engine, "silent_after_probe", word_tokenizer, data, tmp_path)
    assert result.returncode == 1
    assert re.search(r"step 0: all \d+ samples( it ran)? failed", cause), cause
    assert "hung: no result after 3.0 s (generate_timeout)" in cause
    assert "their prompts are not used up" in cause and "served again on --resume" in cause
    metrics = rows(out / "metrics.jsonl")[0]
    assert metrics["ledger/failed"] == metrics["ledger/requeued"] > 0
    assert metrics["ledger/entered"] == metrics["ledger/failed"] + metrics["ledger/returned"]


HANGING_REWARD = """
import os, time
from pathlib import Path


def hangs(args, sample, **kwargs):
    marks = Path(os.environ["RLSDK_TEST_MARKS"])
    if not marks.exists():
        marks.write_text(str(time.time()))
    time.sleep(3600)
"""


@pytest.mark.plugins("rlsdk_rm_hub")
def test_a_reward_that_never_returns_stops_the_run_at_its_timeout(
    misbehaving_engine, word_tokenizer, data, tmp_path, monkeypatch
):
    """The reward runs in the run's own process (a thread it abandons at the timeout); the run must not wait
    for that thread at exit."""
    reward = tmp_path / "reward.py"
    reward.write_text(HANGING_REWARD)
    marks = tmp_path / "marks"
    monkeypatch.setenv("RLSDK_TEST_MARKS", str(marks))
    out = tmp_path / "run"
    options = run_options(misbehaving_engine.url, word_tokenizer, data, out, "--reward-timeout", str(DEADLINE))
    options[options.index("f1")] = f"{reward}:hangs"
    result = rlsdk_run(*options)
    assert marks.exists()  # the reward was called and hung
    cause = one_line_cause(result.stdout + result.stderr)
    assert result.returncode == 1
    assert re.search(r"step 0: all \d+ samples( it ran)? were dropped for an invalid reward", cause), cause
    assert "reward.py:hangs': timed out after 3s (reward_timeout)" in cause, cause
    metrics = rows(out / "metrics.jsonl")[0]
    assert metrics["ledger/entered"] == metrics["ledger/dropped"] + metrics["ledger/returned"] + metrics["ledger/failed"]


def wait_for(predicate, seconds: float = 60.0) -> None:
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, "not within the test's own limit"
        time.sleep(0.05)


@pytest.mark.plugins("rlsdk_generators")
def test_the_buffer_service_killed_mid_step_stops_the_run_at_its_wait_and_resume_loses_no_group(
    buffer_service, misbehaving_engine, chat_tokenizer, tmp_path
):
    """``rlsdk buffer serve`` and ``rlsdk run`` (the ``rollout_buffer`` rollout) in subprocesses: the run
    takes group ``a`` and waits for ``b``; the service is SIGKILLed. The run stops with exit 1 after
    ``rollout_buffer_wait`` naming the silent service, its lease of ``a`` kept; the service restarted from
    its folder and the run resumed (in process) get both groups: nothing lost."""
    service = buffer_service()
    tokenizer, chats = buffer_run_inputs(service, chat_tokenizer, tmp_path, "w1")
    out = tmp_path / "run"
    options = [
        "--engine", misbehaving_engine.url, "--hf-checkpoint", str(tokenizer), "--data", str(chats),
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1", "--output", str(out),
        "--set", "rollout_function_path=rollout_buffer", "--set", f"rollout_buffer_wait={DEADLINE}",
    ]
    run = subprocess.Popen([*RLSDK, "run", *options, "--set", f"rollout_buffer_url={service.url}"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        leases = out / "rollout_buffer_leases.json"
        wait_for(lambda: leases.exists() and json.loads(leases.read_text()) or run.poll() is not None)
        service.kill()
        output, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    cause = one_line_cause(output)
    assert run.returncode == 1
    assert f"rollout buffer {service.url}: 1 of 2 complete groups after 3s (--rollout-buffer-wait)" in cause
    assert "the service has not answered for" in cause and "ConnectError" in cause
    assert f"served again on --resume (rlsdk run --resume --output {out})" in cause
    assert [step for step, _ in json.loads(leases.read_text())] == [0]  # a: leased to the run, not lost

    restarted = buffer_service(data_dir=tmp_path / "buffer")
    for n in range(2):
        httpx.post(restarted.url + "/buffer/write", json=buffer_item("b", n)).raise_for_status()
    from rlsdk import RolloutConfig
    from rlsdk.run.job import run_job

    run_job(RolloutConfig(  # in process: a second rlsdk run would cost its start-up
        engine=misbehaving_engine.url, hf_checkpoint=str(tokenizer), prompt_data=str(chats), rollout_batch_size=2,
        n_samples_per_prompt=2, num_rollout=1, output_dir=str(out), rollout_function_path="rollout_buffer",
        rollout_buffer_url=restarted.url, rollout_buffer_wait=DEADLINE, resume=True,
    ))
    samples = rows(out / "rollouts.jsonl")
    assert sorted(s["metadata"]["uid"] for s in samples) == ["a-0", "a-1", "b-0", "b-1"]
    assert json.loads(leases.read_text()) == []


FIRST_MOD4 = """
import os, signal, time


def first_mod4(args, sample, **kwargs):
    return float(sample.tokens[-sample.response_length] % 4 == 0) if sample.response_length else 0.0


def kill_engine(args, version_dir, rollout_engines):
    os.kill(int(os.environ["RLSDK_TEST_ENGINE_PID"]), signal.SIGKILL)
    time.sleep(0.5)  # gone before the sync asks it to load what was written
"""


@pytest.mark.plugins("rlsdk_embedded")
def test_an_engine_killed_mid_sync_stops_the_run_naming_it_and_the_resume(tiny_llama, tmp_path):
    """``rlsdk serve`` (the tiny Llama) and ``rlsdk run --train`` against it, in subprocesses; the engine is
    SIGKILLed in the middle of the first sync, once the weights are written and before the engine is asked
    to load them (by the run's ``update_weight_post_write`` plugin, the one point a test can reach in
    there). The run stops with exit 1 and one line naming the engine and how to resume, and the ledger of
    the step it trained balances."""
    out = tmp_path / "run"
    serve = subprocess.Popen([*RLSDK, "serve", "--model", str(tiny_llama), "--port", "0", "--set", "engine_threads=1",
                              "--allow-weights-dir", str(out)], stderr=subprocess.PIPE, text=True)
    run = None
    try:
        lines = [serve.stderr.readline() for _ in range(1)]  # type: ignore[union-attr]
        while not lines[-1].startswith("rlsdk serve: ") and lines[-1]:
            lines.append(serve.stderr.readline())  # type: ignore[union-attr]
        line = lines[-1]
        assert line.startswith("rlsdk serve: "), lines
        url = line.split(" at ")[1].split()[0]
        data = tmp_path / "prompts.jsonl"
        data.write_text("".join(json.dumps({"input": f"w{i} w{i + 1}"}) + "\n" for i in range(8)))
        reward = tmp_path / "reward.py"
        reward.write_text(FIRST_MOD4)
        run = subprocess.Popen(
            [*RLSDK, "run", "--train", "--engine", url, "--hf-checkpoint", str(tiny_llama), "--data", str(data),
             "--rm-type", f"{reward}:first_mod4", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
             "--rollout-max-response-len", "2", "--num-rollout", "2", "--output", str(out),
             "--weight-sync-timeout", str(DEADLINE), "--set", "train_threads=1", *FAST_RETRIES,
             "--set", f"custom_update_weight_post_write_path={reward}:kill_engine"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "RLSDK_TEST_ENGINE_PID": str(serve.pid)},
        )
        output, _ = run.communicate(timeout=120)
    finally:
        for process in (serve, run):
            if process is not None and process.poll() is None:
                process.kill()
    cause = one_line_cause(output)
    assert run.returncode == 1, output
    assert f"the weight sync of version 1 to SGLangClient ({url}) over the disk transport failed: " in cause
    assert "cannot reach SGLang at" in cause and f"then continue with: rlsdk run --resume --output {out}" in cause
    metrics = rows(out / "metrics.jsonl")
    assert all(m["ledger/entered"] == m["ledger/kept"] + m["ledger/dropped"] + m["ledger/returned"] + m["ledger/failed"]
               for m in metrics)


HANGING_LOSS = """
import os, time
from pathlib import Path


def hangs_at_step_1(args, batch, logits, sum_of_sample_mean):
    # REINFORCE; once step 0's checkpoint is written (step 1 on) it never returns: a deadlocked loss
    import torch
    from rlsdk import log_probs_and_entropy

    if (Path(args.output_dir) / "checkpoints" / "step_0").exists():
        Path(os.environ["RLSDK_TEST_MARKS"]).write_text(str(time.time()))
        time.sleep(3600)
    log_probs, _ = log_probs_and_entropy(logits, batch, args, with_entropy=False)
    loss = sum_of_sample_mean(-torch.cat(batch["advantages"]) * torch.cat(log_probs))
    return loss, {"loss": loss.detach()}
"""

EVAL_HANGS = """
import asyncio, os, time
from pathlib import Path

from rlsdk import single_turn


async def eval_hangs(args, sample, sampling_params, evaluation=False):
    # training samples as usual; an eval sample never returns (an engine stuck on the eval's long answers)
    if evaluation:
        marks = Path(os.environ["RLSDK_TEST_MARKS"])
        if not marks.exists():
            marks.write_text(str(time.time()))
        await asyncio.sleep(3600)
    return await single_turn(args, sample, sampling_params)
"""


def ray_run(tiny_llama: Path, run_files: tuple[Path, str], out: Path, marks: Path, *more: str) -> subprocess.Popen:
    """``rlsdk run --ray --train`` of the tiny Llama in a subprocess, on the local Ray cluster it starts for
    itself; ``RLSDK_TEST_MARKS`` tells its plugins where to note the moment they hang."""
    data, reward = run_files
    return subprocess.Popen(
        [*RLSDK, "run", "--ray", "--train", "--model", str(tiny_llama), "--data", str(data), "--rm-type", reward,
         "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "2",
         "--save-interval", "1", "--output", str(out), "--ray-engine-cpus", "0.5", "--ray-standby-engines", "0",
         "--set", "engine_threads=1", "--set", "train_threads=1", *more],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "RLSDK_TEST_MARKS": str(marks)},
    )


def finished(run: subprocess.Popen) -> str:
    """The run's output once it ended (no hang: within the test's own limit, far below the 3600 s its plugin
    sleeps and the 600 s of ``--generate-timeout``)."""
    try:
        output, _ = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    return output


def descendants_titled(root: int, title: str) -> list[int]:
    """The processes under ``root`` whose command line starts with ``title`` (Ray names an actor's worker
    ``ray::ClassName``)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found = []
    for pid in parents:
        ancestor = pid
        while ancestor in parents and ancestor != root:
            ancestor = parents[ancestor]
        try:
            if ancestor == root and Path(f"/proc/{pid}/cmdline").read_bytes().startswith(title.encode()):
                found.append(pid)
        except OSError:
            pass
    return found


def resumable_and_balanced(out: Path) -> None:
    """Every step written balances its ledger, and every sample drawn is in the outputs or the saved buffer."""
    metrics = rows(out / "metrics.jsonl")
    assert metrics
    assert all(m["ledger/entered"] == m["ledger/kept"] + m["ledger/dropped"] + m["ledger/returned"] + m["ledger/failed"]
               for m in metrics)
    from rlsdk.rollout.ledger import audit_run

    audit = audit_run(out)
    assert audit["lost"] == 0 and audit["duplicated"] == 0, audit


@pytest.mark.timeout(300)
@pytest.mark.plugins("rlsdk_embedded")
def test_a_trainer_actor_whose_train_step_hangs_stops_the_run_at_its_deadline(tiny_llama, run_files, tmp_path):
    """``rlsdk run --ray --train`` whose loss (run in the trainer actor) never returns from step 1 on: the run
    stops with exit 1 and one line naming the actor's method, the deadline, where the actor ran and the
    checkpoint to resume from; step 0 is written and balances."""
    pytest.importorskip("ray", reason="rlsdk[ray] is not installed")
    loss = tmp_path / "loss.py"
    loss.write_text(HANGING_LOSS)
    out, marks = tmp_path / "run", tmp_path / "marks"
    run = ray_run(tiny_llama, run_files, out, marks, "--num-rollout", "2", "--loss-type", "custom_loss",
                  "--custom-loss-function-path", f"{loss}:hangs_at_step_1", "--ray-trainer-timeout", str(RAY_DEADLINE))
    output = finished(run)
    assert marks.exists(), output  # the loss was called at step 1 and hung
    cause = one_line_cause(output)
    assert run.returncode == 1, output
    assert "the trainer actor's train_step did not return within 8s (--ray-trainer-timeout) on node " in cause
    assert "taken for hung, its actor stopped" in cause
    assert f"The last checkpoint is {out / 'checkpoints' / 'step_0'}: continue with rlsdk run --resume" in cause
    resumable_and_balanced(out)


@pytest.mark.timeout(300)
@pytest.mark.plugins("rlsdk_embedded")
def test_a_trainer_that_dies_while_an_async_run_s_eval_hangs_stops_the_run_at_once(tiny_llama, run_files, tmp_path):
    """``rlsdk run --ray --train --async`` whose eval after step 1 never ends (every eval sample hangs); the
    trainer actor's process is SIGKILLed meanwhile (an OOM kill). The run does not drain the eval for a
    trainer that is gone: it stops with exit 1 and one line naming the trainer, the eval and the checkpoint
    to resume from; the steps written balance."""
    pytest.importorskip("ray", reason="rlsdk[ray] is not installed")
    generate = tmp_path / "generate.py"
    generate.write_text(EVAL_HANGS)
    data, _ = run_files
    out, marks = tmp_path / "run", tmp_path / "marks"
    run = ray_run(tiny_llama, run_files, out, marks, "--async", "--num-rollout", "3", "--eval-interval", "2",
                  "--skip-eval-before-train", "--eval-prompt-data", "held", str(data),
                  "--custom-generate-function-path", f"{generate}:eval_hangs")
    try:
        wait_for(lambda: marks.exists() or run.poll() is not None, 240)
        trainers = descendants_titled(run.pid, "ray::TrainerActor")
        assert len(trainers) == 1, trainers
        os.kill(trainers[0], signal.SIGKILL)
    finally:
        output = finished(run)
    cause = one_line_cause(output)
    assert run.returncode == 1, output
    assert "the trainer died during the eval after step 1 (node " in cause
    assert f"The last checkpoint is {out / 'checkpoints' / 'step_0'}: continue with rlsdk run --resume" in cause
    resumable_and_balanced(out)
