"""Environments as installable packages: ``rlsdk plugins new NAME --kind environment`` writes one that passes
its own tests, installs with pip (its data files inside it), shows its parts in ``rlsdk plugins show`` and
trains with ``rlsdk run --train --env NAME`` (on the tiny Llama of conftest.py, whose word-level tokenizer has
no chat template: ``--no-chat-template`` overrides the environment's setting, as any command-line option does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlsdk_cli.app import app


def cli(*args: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlsdk_cli.app", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.plugins("rlsdk_embedded")
def test_a_new_environment_installs_passes_its_tests_shows_its_parts_and_trains(tmp_path, tiny_llama, pip_install):
    result = CliRunner().invoke(
        app, ["plugins", "new", "two-sums", "--kind", "environment", "--dir", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    root = tmp_path / "two-sums"
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / "tests")],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root / "src")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert tests.returncode == 0 and "1 passed" in tests.stdout, tests.stdout + tests.stderr

    site = pip_install(root)  # a real pip install into a folder of its own, put on the path below
    assert (site / "two_sums" / "data" / "train.jsonl").exists()
    env = {**os.environ, "PYTHONPATH": str(site)}
    shown = cli("plugins", "show", "two_sums", "--json", env=env)
    parts = json.loads(shown.stdout)["parts"]
    assert parts["dataset"] == str(site / "two_sums" / "data" / "train.jsonl")
    assert parts["reward"] == "0.9 x two_sums_correct + 0.1 x two_sums_brief" and parts["chat"] is True
    assert parts["eval sets"][0]["name"] == "two_sums-eval"

    out = tmp_path / "run"
    run = cli(
        "run",
        "--train",
        "--env",
        "two_sums",
        "--model",
        str(tiny_llama),
        "--no-chat-template",
        "--num-rollout",
        "2",
        "--rollout-max-response-len",
        "3",
        "--eval-interval",
        "2",
        "--set",
        "engine_threads=1",
        "--train-threads",
        "1",
        "--output",
        str(out),
        env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 2 and steps[0]["rollout/samples"] == 16  # the environment's training settings: 4 x 4
    assert "rollout/rubric/two_sums_correct" in steps[0] and "train/loss" in steps[0]
    evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert evals[-1]["eval/two_sums-eval/prompts"] == 16
    state = json.loads((out / "state.json").read_text())
    assert state["settings"]["env"] == "two_sums" and state["settings"]["apply_chat_template"] is False


def test_plugins_show_lists_the_arithmetic_environments_parts():
    result = CliRunner().invoke(app, ["plugins", "show", "arithmetic", "--json"])
    assert result.exit_code == 0, result.output
    entry = json.loads(result.output)
    assert entry["kind"] == "environment" and entry["parts"]["data keys"] == {"label_key": "label"}
    assert Path(entry["parts"]["dataset"]).name == "arithmetic-train.jsonl"
    assert entry["train_settings"]["eval_datasets"][0]["name"] == "arithmetic-eval"
