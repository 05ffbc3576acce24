"""``rlsdk run``'s options come from one source: core's from RolloutConfig's fields and docstrings, the plugins'
from their ``rlsdk_options`` hooks. Unknown keys, on the command line, in ``--set`` and in config files, are
errors with a did-you-mean, before any model loads. Runs the real CLI (typer's runner, installed plugins)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rlsdk_cli.app import app

runner = CliRunner()


def invoke(*argv: str):
    return runner.invoke(app, list(argv), env={"COLUMNS": "200"})


@pytest.mark.plugins('rlsdk_generators', 'rlsdk_rm_hub', 'rlsdk_embedded')
def test_help_lists_core_and_plugin_options_with_defaults():
    text = invoke("run", "--help").stdout
    assert "--rollout-batch-size" in text and "Groups (prompts) kept per step. (default: 4)" in text
    assert "--lr" in text and "(default: 1e-06)" in text  # training options, from TrainingOptions
    assert "Plugin options (rlsdk-generators)" in text and "--max-turns" in text
    assert "One of: auto, tag, json. (default: auto)" in text  # tool_call_format's choices
    assert "Plugin options (rlsdk-embedded)" in text and "--engine-device" in text
    assert "`@[start:end]` row slice" in text  # help text is not read as markup


@pytest.mark.parametrize(("argv", "error"), [
    (["--set", "rollout_temprature=0"], "unknown option 'rollout_temprature' (did you mean 'rollout_temperature'?)"),
    (["--set", "max_turns=two"], "option 'max_turns' takes an integer, got 'two'"),
    (["--set", "tool_call_format=xml"], "'tool_call_format' must be one of auto, tag, json, got 'xml'"),
    (["--rollout-batch-sise", "3"], "no such option --rollout-batch-sise (did you mean --rollout-batch-size?)"),
    (["--max-turns", "x"], "Invalid value for '--max-turns'"),
])
@pytest.mark.plugins('rlsdk_generators', 'rlsdk_rm_hub', 'rlsdk_embedded')
def test_unknown_or_wrong_options_are_errors_naming_them(argv, error, tmp_path):
    result = invoke("run", *argv, "--output", str(tmp_path))
    assert result.exit_code == 2 and error in " ".join(result.output.split()), result.output
    assert not list(tmp_path.iterdir())  # nothing ran


def test_config_file_keys_are_checked_too(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("rollout_batch_sise: 8\n")
    result = invoke("run", "--config", str(config), "--output", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert f"{config}: unknown option 'rollout_batch_sise' (did you mean 'rollout_batch_size'?)" in \
        " ".join(result.output.replace("│", " ").split())


def test_an_error_is_printed_as_it_is_not_read_as_markup(tmp_path):
    """rich took ``[ray]`` in "pip install 'rlsdk[ray]'" for a markup tag and dropped it; a path with
    ``[train]`` in its name lost it the same way."""
    missing = tmp_path / "data[train].jsonl"
    result = invoke("run", "--prompt-data", str(missing), "--output", str(tmp_path / "out"))
    assert result.exit_code == 1
    assert f"Error: data file '{missing}' does not exist" in " ".join(result.output.split()), result.output


@pytest.mark.plugins('rlsdk_generators', 'rlsdk_rm_hub', 'rlsdk_embedded')
def test_plugins_show_lists_the_options_the_plugin_declares():
    entry = json.loads(invoke("plugins", "show", "drop_stale", "--json").stdout)
    options = {o["name"]: o for o in entry["options"]}
    assert options["buffer_max_staleness"] == {
        "name": "buffer_max_staleness", "type": "int", "default": None,
        "help": options["buffer_max_staleness"]["help"]}
    assert "drop_stale" in options["buffer_max_staleness"]["help"]
    text = invoke("plugins", "show", "multi_turn").stdout
    assert "tool_call_format (str, default 'auto', one of auto, tag, json)" in text


def test_rlsdk_run_caps_glibc_malloc_arenas_unless_the_user_set_them(monkeypatch):
    """glibc's per-thread arenas kept 1.5 GB the demo's live tensors no longer used; a user's own
    MALLOC_ARENA_MAX is left to glibc."""
    import platform

    from rlsdk_cli.run import limit_malloc_arenas

    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas() is False
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    assert limit_malloc_arenas() is (platform.libc_ver()[0] == "glibc")


def test_slimes_trainer_flags_are_taken_and_named_as_unused(tmp_path):
    """A slime launch script's Megatron settings (``--attention-backend flash``, a bare ``--balance-data``) are
    taken and named as used by no rlsdk trainer; ``--optimizer``/``--lr-decay-style`` only at the one value
    rlsdk's trainers have."""
    config = invoke("run", "--print-config", "--attention-backend", "flash", "--balance-data", "--optimizer", "adam",
                    "--lr-decay-style", "constant", "--eval-top-k", "5", "--output", str(tmp_path))
    assert config.exit_code == 0, config.output
    assert "attention_backend: flash" in config.stdout and "balance_data: true" in config.stdout
    assert "eval_top_k: 5" in config.stdout
    wrong = invoke("run", "--optimizer", "sgd", "--output", str(tmp_path / "out"))
    assert wrong.exit_code == 2 and "optimizer 'sgd': rlsdk's trainers take 'adam' only" in " ".join(wrong.output.split())
