"""A dead or broken engine: ``rlsdk run`` against a real misbehaving HTTP server on loopback (and a port
where nothing listens), in subprocesses where the exit code and the terminal matter.

Before: exit 0 or a failed step after every prompt of it was used up, 5xx never retried, and
``JSONDecodeError: Expecting value`` for an HTML page."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from pathlib import Path

import pytest

from rlsdk import RolloutConfig
from rlsdk.data import DataSource
from rlsdk.run.engine_health import EngineHealthError
from rlsdk.engines.protocol import EngineError, EngineResponseError
from rlsdk.engines.sglang_client import SGLangClient
from rlsdk.plugins.manager import get_plugin_manager
from rlsdk.run.job import run_job
from rlsdk.rollout.step import MAX_ENGINE_REQUEUES, rollout_step
from rlsdk.runtime import Runtime, bind_runtime
from rlsdk.testing import ByteTokenizer

from .conftest import rlsdk_run, run_options


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# ---------------------------------------------------------------- the health check before the first step


@pytest.mark.plugins("rlsdk_rm_hub")
@pytest.mark.parametrize("command", ["run", "eval"])
def test_a_dead_port_stops_the_run_before_any_data_is_used(word_tokenizer, data, tmp_path, command):
    url = f"http://127.0.0.1:{dead_port()}"
    out = tmp_path / "run"
    options = run_options(url, word_tokenizer, data, out)
    if command == "eval":  # rlsdk eval refuses the options of a run's steps
        for step_option in ("--rollout-batch-size", "--n-samples-per-prompt", "--num-rollout"):
            at = options.index(step_option)
            del options[at : at + 2]
    result = rlsdk_run(*options, command=command)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "engine 'sglang' from rlsdk " in output and f"at {url} failed its health check" in output
    assert "cannot reach SGLang" in output and "after 2 tries: ClientConnectorError: Cannot connect" in output
    assert "no step ran, no data was used" in output and "Traceback" not in output
    assert not (out / "state.json").exists() and not rows(out / "discarded.jsonl")


@pytest.mark.plugins("rlsdk_rm_hub")
def test_a_server_that_answers_500_stops_the_run_before_any_data_is_used(
    misbehaving_engine, word_tokenizer, data, tmp_path
):
    misbehaving_engine.mode = "500"
    out = tmp_path / "run"
    result = rlsdk_run(*run_options(misbehaving_engine.url, word_tokenizer, data, out))
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert f"at {misbehaving_engine.url} failed its health check" in output
    assert "answered 500 after 2 tries: CUDA error: an illegal memory access" in output
    assert misbehaving_engine.requests == 2  # the probe and its one retry; no prompt was sent
    assert not (out / "state.json").exists() and "Traceback" not in output


@pytest.mark.parametrize(
    ("mode", "problem", "shown"),
    [
        ("garbage", "answered 200 with a body that is not JSON", "'<html><body>502 Bad Gateway"),
        (
            "wrong_shape",
            "unreadable /generate answer (no meta_info object)",
            """'{"choices": [{"text": "hello"}]}'""",
        ),
    ],
)
@pytest.mark.plugins("rlsdk_rm_hub")
def test_a_server_that_answers_nonsense_is_named_with_what_was_expected(
    misbehaving_engine, word_tokenizer, data, tmp_path, mode, problem, shown
):
    misbehaving_engine.mode = mode
    args = RolloutConfig(
        engine=misbehaving_engine.url,
        hf_checkpoint=word_tokenizer,
        prompt_data=str(data),
        output_dir=str(tmp_path / "run"),
        sglang_retries=0,
    )
    with pytest.raises(EngineHealthError) as caught:
        run_job(args)
    message = str(caught.value)
    assert f"{misbehaving_engine.url}/generate: {problem}; expected " in message
    assert '{"text": str, "meta_info": {"finish_reason"' in message and shown in message
    assert not (tmp_path / "run" / "state.json").exists()


# ---------------------------------------------------------------- the client: retries and unreadable answers


def client_call(engine, call, **options):
    async def scenario():
        client = SGLangClient(engine.url, **options)
        try:
            return await call(client)
        finally:
            await client.close()

    return asyncio.run(scenario())


def generate_one(client):
    return client.generate({"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 1}})


def test_5xx_and_cut_connections_are_retried_with_backoff(misbehaving_engine):
    misbehaving_engine.fail_next, misbehaving_engine.reset_next = 2, 1
    answer = client_call(misbehaving_engine, generate_one, retries=3, backoff=0.01)
    assert answer["output_ids"] == [9] and misbehaving_engine.requests == 4


def test_retries_are_bounded_then_the_error_says_what_came(misbehaving_engine):
    misbehaving_engine.mode = "500"
    started = time.monotonic()
    with pytest.raises(EngineError, match=r"/generate answered 500 after 4 tries: CUDA error"):
        client_call(misbehaving_engine, generate_one, retries=3, backoff=0.01)
    assert misbehaving_engine.requests == 4 and time.monotonic() - started < 5


def test_an_unreadable_answer_is_quoted_truncated(misbehaving_engine):
    misbehaving_engine.mode = "garbage"
    with pytest.raises(EngineResponseError) as caught:
        client_call(misbehaving_engine, generate_one, retries=0)
    message = str(caught.value)
    assert message.startswith(f"{misbehaving_engine.url}/generate: answered 200 with a body that is not JSON")
    assert "... (341 characters)" in message and len(message) < 600


# ---------------------------------------------------------------- failed samples: their prompts come back


def loop_args(url: str, data: Path, **options) -> RolloutConfig:
    values = {
        "engine": url,
        "prompt_data": str(data),
        "label_key": "label",
        "rm_type": "f1",
        "rollout_batch_size": 2,
        "over_sampling_batch_size": 1,
        "n_samples_per_prompt": 2,
        "sglang_retries": 0,
    }
    return RolloutConfig(**{**values, **options})


@pytest.mark.plugins("rlsdk_rm_hub")
def test_a_group_the_engine_fails_goes_back_to_the_data_and_the_ledger_balances(misbehaving_engine, data):
    """One prompt (``w0 w1``) always gets a 500: its group fails with the reason, the step takes another
    prompt in its place, and the failed prompt goes back to the data source, pending again from its prompt,
    until it has failed :data:`MAX_ENGINE_REQUEUES` more times."""
    tokenizer, pm = ByteTokenizer(), get_plugin_manager()
    args = loop_args(misbehaving_engine.url, data)
    source = DataSource(args, pm=pm, tokenizer=tokenizer)
    bad = source.prompts[0].sample(0, 0).prompt
    misbehaving_engine.fail_prompt = tokenizer(bad)["input_ids"]
    runtime = bind_runtime(args, Runtime(pm, SGLangClient(misbehaving_engine.url, retries=0), tokenizer))
    try:
        out = runtime.run(rollout_step(args, 0, source, runtime))
        m = out.metrics
        assert m["ledger/entered"] == 6 and m["ledger/kept"] == 4 and m["ledger/failed"] == 2
        assert m["ledger/requeued"] == 2
        assert (
            m["ledger/entered"]
            == m["ledger/kept"] + m["ledger/dropped"] + m["ledger/returned"] + m["ledger/failed"]
        )
        assert [s.prompt for g in out.samples for s in g] == [
            source.prompts[i].sample(0, 0).prompt for i in (1, 1, 2, 2)
        ]
        assert "answered 500: CUDA error" in m["rollout/failures"][0]
        failed = out.discarded[0]
        assert all(s.status.value == "failed" and s.metadata["engine_fault"] for s in failed)
        assert source.get_buffer_length() == 1
        again = source.buffer[0]
        assert [s.prompt for s in again] == [bad, bad] and [s.index for s in again] == [
            s.index for s in failed
        ]
        assert all(
            s.status.value == "pending" and s.response == "" and "generate_error" not in s.metadata
            for s in again
        )
        for step in range(1, MAX_ENGINE_REQUEUES + 1):  # served first each step, failing again
            out = runtime.run(rollout_step(args, step, source, runtime))
            assert out.discarded[0][0].prompt == bad and out.metrics["ledger/failed"] == 2
            assert out.metrics["ledger/requeued"] == (2 if step < MAX_ENGINE_REQUEUES else 0)
        assert source.get_buffer_length() == 0  # failed 1 + MAX_ENGINE_REQUEUES times: used up
    finally:
        runtime.run(runtime.engine.close())
        runtime.loop.close()


@pytest.mark.plugins("rlsdk_rm_hub")
def test_a_step_the_engine_fails_exits_non_zero_and_resume_serves_its_prompts_again(
    misbehaving_engine, word_tokenizer, data, tmp_path
):
    """The engine passes the health check, then answers every request 500: step 0 fails, the run says
    why and exits 1, the ledger balances, and no prompt is used up: ``--resume`` on the mended engine
    serves exactly the groups an uninterrupted run serves."""
    uninterrupted = tmp_path / "uninterrupted"
    run_job(
        RolloutConfig.from_dict(
            {
                "engine": misbehaving_engine.url,
                "hf_checkpoint": word_tokenizer,
                "prompt_data": str(data),
                "label_key": "label",
                "rm_type": "f1",
                "rollout_batch_size": 2,
                "n_samples_per_prompt": 2,
                "num_rollout": 2,
                "output_dir": str(uninterrupted),
            }
        )
    )

    misbehaving_engine.mode = "broken_after_probe"
    out = tmp_path / "run"
    result = rlsdk_run(*run_options(misbehaving_engine.url, word_tokenizer, data, out))
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert re.search(r"step 0: all \d+ samples( it ran)? failed", output), output
    assert "answered 500 after 2 tries" in output
    assert "their prompts are not used up" in output and "Traceback" not in output
    metrics = rows(out / "metrics.jsonl")[0]
    # it stops once a batch's worth of groups failed (T1), not after 8 x the batch: what was in flight
    # goes back to the data unused, what failed goes back too
    assert metrics["ledger/failed"] == metrics["ledger/requeued"] < 32
    assert metrics["ledger/entered"] == metrics["ledger/failed"] + metrics["ledger/returned"]
    assert metrics["ledger/kept"] == 0 and not rows(out / "rollouts.jsonl")
    assert len(rows(out / "discarded.jsonl")) == metrics["ledger/failed"]

    misbehaving_engine.mode = "ok"
    result = rlsdk_run("--resume", "--output", str(out), "--num-rollout", "3")
    assert result.returncode == 0, result.stdout + result.stderr

    def served(folder: Path, first_step: int) -> list[list[tuple]]:
        """Each step's samples, in any order within the step."""
        return [
            sorted(
                (r["group_index"], r["index"], r["prompt"], r["response"])
                for r in rows(folder / "rollouts.jsonl")
                if r["rollout_id"] == step
            )
            for step in (first_step, first_step + 1)
        ]

    assert served(out, first_step=1) == served(uninterrupted, first_step=0)
    assert [len(step) for step in served(out, first_step=1)] == [4, 4]
