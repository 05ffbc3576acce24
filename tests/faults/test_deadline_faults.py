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
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from .conftest import FAST_RETRIES, RLSDK, rlsdk_run, run_options

DEADLINE = 3.0


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def one_line_cause(output: str) -> str:
    """The error line the run ends with (``Error: ...``); no traceback."""
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.lower().startswith("error")]
    assert errors, output
    return errors[-1]


@pytest.mark.plugins("rlsdk_rm_hub")
def test_an_engine_that_accepts_and_never_answers_stops_the_run_at_its_health_check(
    misbehaving_engine, word_tokenizer, data, tmp_path
):
    misbehaving_engine.mode = "silent"
    out = tmp_path / "run"
    options = run_options(misbehaving_engine.url, word_tokenizer, data, out, "--generate-timeout", str(DEADLINE))
    result = rlsdk_run(*options)
    cause = one_line_cause(result.stdout + result.stderr)
    assert result.returncode == 1
    assert f"at {misbehaving_engine.url} failed its health check" in cause
    assert "no answer to a one-token generation within 3s (generate_timeout)" in cause
    assert "no step ran, no data was used" in cause
    assert not (out / "state.json").exists()


@pytest.mark.plugins("rlsdk_rm_hub")
def test_an_engine_that_goes_silent_after_its_health_check_fails_the_step_and_loses_no_prompt(
    misbehaving_engine, word_tokenizer, data, tmp_path
):
    misbehaving_engine.mode = "silent_after_probe"
    out = tmp_path / "run"
    options = run_options(misbehaving_engine.url, word_tokenizer, data, out, "--generate-timeout", str(DEADLINE))
    result = rlsdk_run(*options)
    cause = one_line_cause(result.stdout + result.stderr)
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


def buffer_item(instance: str, n: int) -> dict:
    return {
        "instance_id": instance,
        "uid": f"{instance}-{n}",
        "reward": 1.0,
        "messages": [{"role": "user", "content": "w1"}, {"role": "assistant", "content": f"w{n}"}],
    }


@pytest.mark.plugins("rlsdk_generators")
def test_the_buffer_service_killed_mid_step_stops_the_run_at_its_wait_and_resume_loses_no_group(
    buffer_service, misbehaving_engine, chat_tokenizer, tmp_path
):
    """``rlsdk buffer serve`` and ``rlsdk run`` (the ``rollout_buffer`` rollout) in subprocesses: the run
    takes group ``a`` and waits for ``b``; the service is SIGKILLed. The run stops with exit 1 after
    ``rollout_buffer_wait`` naming the silent service, its lease of ``a`` kept; the service restarted from
    its folder and the run resumed (in process) get both groups: nothing lost."""
    service = buffer_service()
    for n in range(2):
        httpx.post(service.url + "/buffer/write", json=buffer_item("a", n)).raise_for_status()
    tokenizer = tmp_path / "tokenizer"
    chat_tokenizer.save_pretrained(tokenizer)
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"input": [{"role": "user", "content": "w1"}]}) + "\n")
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
