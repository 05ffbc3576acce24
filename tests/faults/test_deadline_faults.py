"""Deadlines on cross-process waits (issue 48): ``rlsdk run`` in a subprocess against a real peer that stalls (an
engine on loopback that accepts requests and never answers, a reward in the run's own process that never
returns). Each case ends (no hang: ``rlsdk_run``'s 120 s limit) with exit 1, a one-line cause naming what was
waited for, for how long and the option (so it was the deadline that fired, not a default), and a ledger that
balances. Deadlines are short (3 s) so that the suite stays fast. How long after the peer went silent each run
ended is measured, not asserted here (docs/faults.md, "Deadlines on cross-process waits")."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .conftest import rlsdk_run, run_options

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
