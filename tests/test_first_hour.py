"""A new user's first hour, round 4 (issue 57): every file a run reads checked before the first step, and
``--resume`` changing the eval set; steps with no learning signal said on the terminal and in the run's
summary; the eval before training and the before/after summary; unscored eval samples said; what ``rlsdk
eval`` scores (``--print-config``), a LoRA checkpoint evaluated directly and exported with its run's eval set;
the scaffolded environment's eval rows apart from its training rows.

The end-to-end runs are real ``rlsdk`` subprocesses training the tiny random Llama of conftest.py (its
answers do not matter: the run's outputs do); the step's metrics come from rlsdk.testing's FakeEngine
(``test_rollout_loop``'s fixture) where a model would only add time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rlsdk import RolloutConfig, Sample
from rlsdk.rollout.evaluation import warn_unscored
from rlsdk.run.learning_signal import no_signal
from rlsdk.run.output import saved_settings
from rlsdk_cli.app import app
from rlsdk_cli.scaffold import environment_rows

from . import test_rollout_loop as loop

runner = CliRunner()
make_run = loop.make_run
ZERO_REWARD = '''
def zero(args, sample, **kwargs):
    """0 for every response: no learning signal."""
    return 0.0
'''


def rlsdk(*argv: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    """The real console script in a fresh process."""
    exe = Path(sys.executable).with_name("rlsdk")
    return subprocess.run([str(exe), *argv], capture_output=True, text=True, timeout=timeout)


def rows_file(path: Path, n: int) -> Path:
    path.write_text(
        "".join(
            json.dumps({"input": f"w{i} w{i + 1} w{i + 2}", "label": f"w{i + 3}"}) + "\n" for i in range(n)
        )
    )
    return path


@pytest.mark.plugins("rlsdk_rm_hub")  # the demo's math reward
def test_a_wrong_eval_data_path_fails_before_the_engine_starts(tmp_path):
    """The model folder does not exist either: the eval set's error comes first, as no engine started."""
    data = rows_file(tmp_path / "rows.jsonl", 4)
    argv = [
        "run",
        "--data",
        str(data),
        "--label-key",
        "label",
        "--model",
        str(tmp_path / "no-model"),
        "--eval-data",
        f"held={tmp_path / 'held.jsonl'}",
        "--output",
        str(tmp_path / "out"),
    ]
    result = runner.invoke(app, argv, env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert f"eval dataset 'held': data file '{tmp_path / 'held.jsonl'}' does not exist" in result.output
    assert not (tmp_path / "out" / "metrics.jsonl").exists()
    (tmp_path / "held.jsonl").write_text(json.dumps({"question": "w1"}) + "\n")
    result = runner.invoke(app, argv, env={"COLUMNS": "200"})
    assert result.exit_code == 1 and "eval dataset 'held': " in result.output
    assert "held.jsonl:line 1: no input key 'input'" in result.output


def test_resume_may_change_the_eval_set(tmp_path):
    data, held = rows_file(tmp_path / "rows.jsonl", 4), rows_file(tmp_path / "held.jsonl", 2)
    args = RolloutConfig(
        prompt_data=str(data),
        num_rollout=2,
        output_dir=str(tmp_path / "out"),
        eval_datasets=[{"name": "old", "path": str(data)}],
    )
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "state.json").write_text(
        json.dumps({"next_rollout_id": 2, "settings": saved_settings(args)})
    )
    result = runner.invoke(
        app,
        [
            "run",
            "--resume",
            "--output",
            str(tmp_path / "out"),
            "--eval-data",
            str(held),
            "--n-samples-per-eval-prompt",
            "4",
        ],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert f"eval_datasets = held={held}" in result.output and "is finished (2 of 2 steps)" in result.output


def test_a_step_whose_rewards_are_all_equal_has_no_learning_signal_and_says_why(make_run):
    args, source, runtime, _ = make_run(n_prompts=4)  # the fake engine answers every prompt right
    metrics = loop.step(args, source, runtime).metrics
    assert metrics["rollout/reward_min"] == metrics["rollout/reward_max"] == 1.0
    assert metrics["rollout/groups_with_spread"] == 0
    assert no_signal(args, metrics).startswith(
        "no learning signal: every reward is 1; equal rewards give GRPO "
        "nothing to learn. Likely cause: every sample earns 1: the task is "
        "too easy"
    )
    zeros = {**metrics, "rollout/reward_min": 0.0, "rollout/reward_max": 0.0}
    assert "no --label-key is set" in no_signal(args.replace(label_key=None), zeros)
    assert "--apply-chat-template" in no_signal(args, zeros)
    truncated = {**zeros, "rollout/truncated": metrics["rollout/samples"]}
    assert "every response was cut at --rollout-max-response-len (64 tokens)" in no_signal(args, truncated)
    spread = {**metrics, "rollout/reward_min": 0.0}
    assert "each prompt is always solved or never" in no_signal(args, spread)
    assert no_signal(args, {**metrics, "rollout/groups_with_spread": 1}) is None


def test_eval_samples_that_failed_or_got_no_reward_are_said_with_their_causes():
    failed = Sample(status=Sample.Status.FAILED, metadata={"generate_error": "hung: no result after 600.0 s"})
    invalid = Sample(metadata={"reward_error": "reward 'math' on sample 0/1: no label"})
    with pytest.warns(
        UserWarning,
        match=r"eval held: 2 failed \(hung: no result after 600.0 s\) and 1 got no "
        r"valid reward \(reward 'math'.*: no label\) of 4 samples: reward_mean "
        r"leaves them out",
    ):
        warn_unscored("held", [failed, failed, invalid, Sample(reward=1.0)], 3)


def test_eval_says_what_it_scores_and_prints_its_config(tmp_path):
    result = runner.invoke(app, ["eval", "--print-config"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    values = yaml.safe_load(result.stdout)
    assert [d["name"] for d in values["eval_datasets"]] == [
        "arithmetic-eval"
    ]  # held out, not the training set
    result = runner.invoke(app, ["eval", "--model", str(tmp_path / "no-model")], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert "eval: " + str(tmp_path / "no-model") + ", reward math, 1 sample(s) per prompt" in result.output
    assert "data arithmetic-eval = " in result.output
    assert "(the held-out set of the environment 'arithmetic')" in result.output


def test_the_scaffolded_environment_evaluates_on_problems_it_does_not_train_on():
    train = [json.loads(line)["input"] for line in environment_rows(64, 0).splitlines()]
    held = [json.loads(line)["input"] for line in environment_rows(16, 64).splitlines()]
    assert len(set(train)) == 64 and len(set(held)) == 16 and not set(train) & set(held)


@pytest.mark.plugins("rlsdk_embedded")
def test_a_lora_run_with_no_signal_says_so_summarises_before_and_after_and_its_checkpoint_evaluates(
    tiny_llama, tmp_path
):
    """One real run: the tiny Llama with a LoRA adapter on a reward that is always 0. The eval before training
    prints its table, each step warns of no learning signal with the cause, the summary gives the eval before
    and after; the adapter checkpoint is evaluated as it is, and exported merged with its run's eval set."""
    data, held = rows_file(tmp_path / "rows.jsonl", 8), rows_file(tmp_path / "held.jsonl", 2)
    (tmp_path / "reward.py").write_text(ZERO_REWARD)
    out = tmp_path / "out"
    run = rlsdk(
        "run",
        "--train",
        "--model",
        str(tiny_llama),
        "--data",
        str(data),
        "--label-key",
        "label",
        "--rm-type",
        f"{tmp_path / 'reward.py'}:zero",
        "--lora-rank",
        "4",
        "--num-rollout",
        "2",
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--rollout-max-response-len",
        "2",
        "--eval-data",
        f"held={held}",
        "--eval-interval",
        "2",
        "--engine-threads",
        "1",
        "--train-threads",
        "1",
        "--output",
        str(out),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    err = run.stderr
    assert "eval before training" in err and "eval/held/reward_mean" in err
    assert (
        "step 0: no learning signal: every reward is 0; equal rewards give GRPO nothing to learn. Likely "
        "cause: " in err  # the cause depends on whether the tiny Llama's replies ended within 2 tokens
    )
    assert f"summary of {out} (2 steps):" in err
    assert "eval held: reward 0.000 before training -> 0.000 after step 1 (+0.000)" in err
    assert "2 of 2 steps had no learning signal (0, 1): every reward is 0; equal" in err

    checkpoint = out / "checkpoints" / "step_1"
    assert (checkpoint / "adapter_config.json").is_file() and not (checkpoint / "config.json").exists()
    evaluated = rlsdk("eval", "--model", str(checkpoint))
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert (
        f"with the LoRA adapter {checkpoint}" in evaluated.stderr
        and f"data held = {held}" in evaluated.stderr
    )
    assert json.loads(evaluated.stdout.splitlines()[-1])["eval/held/prompts"] == 2

    merged = tmp_path / "merged"
    export = rlsdk("export", str(checkpoint), "--merge", "--base", str(tiny_llama), "-o", str(merged))
    assert export.returncode == 0, export.stderr[-3000:]
    shown = runner.invoke(app, ["eval", "--model", str(merged), "--print-config"], env={"COLUMNS": "200"})
    assert yaml.safe_load(shown.stdout)["eval_datasets"] == [{"name": "held", "path": str(held)}]


@pytest.mark.plugins("rlsdk_embedded")
def test_a_model_folder_holding_an_adapter_names_eval_and_export_merge(tmp_path):
    from rlsdk_embedded.model_files import ModelNotFoundError, resolve_model_path

    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(
        ModelNotFoundError,
        match=r"holds a LoRA adapter, not a whole model: `rlsdk eval --model .*` "
        r"evaluates it over its base model;.*rlsdk export .* --merge --base",
    ):
        resolve_model_path(tmp_path)


def test_the_docs_site_shows_sphinx_roles_as_code():
    """The griffe extension mkdocs.yml names, on the public API the site documents (docs/api.md)."""
    import importlib.util

    import griffe

    path = Path(__file__).parents[1] / "scripts" / "docs_roles.py"
    spec = importlib.util.spec_from_file_location("docs_roles", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.without_roles("see :func:`~rlsdk.run.job.run_job` and :class:`rlsdk.Sample`") == (
        "see `run_job` and `rlsdk.Sample`"
    )
    extensions = griffe.load_extensions(module.SphinxRoles())
    package = griffe.load("rlsdk", search_paths=[str(Path(__file__).parents[1] / "core")], extensions=extensions)
    texts = [obj.docstring.value for obj in iter_objects(package) if obj.docstring is not None]
    assert len(texts) > 100 and not [t for t in texts if module.ROLE.search(t)]


def iter_objects(obj):
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from iter_objects(member)
