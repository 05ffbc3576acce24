"""``rlsdk plugins`` through typer's runner and through the real console script."""

import json
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from rlsdk import __version__
from rlsdk_cli.app import app

from .test_manager import REWARD_PLUGIN

runner = CliRunner()
HUBS = {"rlsdk-rm-hub", "rlsdk-filter-hub", "rlsdk-generators", "rlsdk-embedded"}


def _list_json(*extra: str) -> list[dict]:
    result = runner.invoke(app, ["plugins", "list", "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.plugins('rlsdk_rm_hub', 'rlsdk_filter_hub')
def test_list_json_shows_the_hubs_with_their_names():
    rows = {row["entry_point"]: row for row in _list_json()}
    assert HUBS <= {row["distribution"] for row in rows.values()}
    for row in rows.values():
        assert set(row) >= {"distribution", "version", "entry_point", "provides"}
    assert "f1" in rows["rm_hub"]["provides"]["reward"]
    assert rows["defaults"]["distribution"] == rows["training"]["distribution"] == "rlsdk"
    assert rows["defaults"]["provides"] == {"generate_rollout": ["sglang"], "custom_generate": ["single_turn"],
                                            "buffer_filter": ["pop_first"], "engine": ["sglang"],
                                            "data_source": ["prompt_data"]}
    assert rows["training"]["provides"] == {"trainer": ["torch"], "loss": ["policy_loss", "sft_loss"]}
    assert rows["run"]["provides"] == {"rollout_log": ["jsonl", "tensorboard", "wandb"],
                                       "eval_rollout_log": ["jsonl", "tensorboard", "wandb"],
                                       "environment": ["arithmetic"]}


def test_list_kind_filters_rows_and_kinds():
    rows = _list_json("--kind", "buffer_filter")
    assert rows and all(set(r["provides"]) == {"buffer_filter"} for r in rows)
    result = runner.invoke(app, ["plugins", "list", "--kind", "rewards"])
    assert result.exit_code != 0 and "Choose one of" in result.output


@pytest.mark.plugins('rlsdk_rm_hub', 'rlsdk_filter_hub')
def test_list_table_names_distributions():
    result = runner.invoke(app, ["plugins", "list"])
    assert result.exit_code == 0
    assert "rlsdk-rm-hub" in result.stdout and "f1" in result.stdout


@pytest.mark.plugins('rlsdk_rm_hub', 'rlsdk_filter_hub')
def test_list_reports_a_broken_plugin_without_failing(fake_dist):
    fake_dist("rl-plugin-broken", "0.1.0", "broken", "rl_plugin_broken", "raise ImportError('boom')\n")
    result = runner.invoke(app, ["plugins", "list"])
    assert result.exit_code == 0
    assert "failed to load broken from rl-plugin-broken 0.1.0" in " ".join(result.stdout.split())
    assert "rlsdk-rm-hub" in result.stdout


@pytest.mark.plugins('rlsdk_rm_hub', 'rlsdk_filter_hub')
def test_list_reports_conflicts(fake_dist):
    fake_dist("rl-plugin-a", "1.0.0", "plugin_a", "rl_plugin_a", REWARD_PLUGIN.format(name="f1"))
    result = runner.invoke(app, ["plugins", "list"])
    assert "conflict reward 'f1' provided by" in " ".join(result.stdout.split())


@pytest.mark.plugins('rlsdk_rm_hub', 'rlsdk_filter_hub')
def test_show_prints_kind_distribution_signature_and_doc():
    result = runner.invoke(app, ["plugins", "show", "f1", "--json"])
    assert result.exit_code == 0, result.output
    entry = json.loads(result.stdout)
    assert entry["kind"] == "reward" and entry["distribution"] == "rlsdk-rm-hub"
    assert entry["signature"].startswith("f1(args")
    assert "F1" in entry["doc"]
    text = runner.invoke(app, ["plugins", "show", "pop_first"])
    assert text.exit_code == 0 and "buffer_filter" in text.stdout and "distribution: rlsdk\n" in text.stdout


@pytest.mark.plugins('rlsdk_rm_hub', 'rlsdk_filter_hub')
def test_show_unknown_name_lists_what_is_installed():
    result = runner.invoke(app, ["plugins", "show", "no_such_plugin"])
    assert result.exit_code == 2
    assert "plugin may not be installed" in result.output and "f1" in result.output


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.stdout.strip() == f"rlsdk {__version__}"


def test_console_script_in_a_fresh_interpreter_sees_the_same_plugins():
    """The real console script in a subprocess (as worker processes would see plugins)."""
    exe = shutil.which("rlsdk") or str((__import__("pathlib").Path(sys.executable).parent / "rlsdk"))
    out = subprocess.run([exe, "plugins", "list", "--json"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == _list_json()


def test_cli_does_not_import_heavy_libraries():
    code = ("import sys; from rlsdk_cli.app import app; from rlsdk import get_plugin_manager; "
            "pm = get_plugin_manager(); [pm.names(k) for k in ('reward', 'engine')]; "
            "print(sorted(m for m in ('torch', 'transformers', 'sglang', 'math_verify') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("argv", "loaded"), [(["plugins", "list"], ["plugins"]), (["--help"], None)])
def test_a_subcommand_module_is_imported_only_when_it_runs(argv, loaded):
    """``rlsdk plugins list`` imports no other subcommand's module; ``--help`` loads every subcommand to list
    it; neither imports aiohttp (the servers'). Start-up times: benchmarks/startup.py."""
    modules = ("plugins", "run", "score", "serve", "export", "view", "buffer", "tinker")
    code = (f"import sys, runpy; sys.argv = ['rlsdk', *{argv!r}]\n"
            "try:\n    runpy.run_module('rlsdk_cli.app', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            f"print(sorted(m for m in {modules!r} if 'rlsdk_cli.' + m in sys.modules), 'aiohttp' in sys.modules,"
            " file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    expected = f"{sorted(loaded or modules)} False"
    assert out.stderr.strip().splitlines()[-1] == expected


@pytest.mark.plugins('rlsdk_rm_hub', 'rlsdk_filter_hub')
def test_list_json_carries_the_conflicts_the_table_shows(fake_dist):
    fake_dist("rl-plugin-a", "1.0.0", "plugin_a", "rl_plugin_a", REWARD_PLUGIN.format(name="f1"))
    rows = {row["distribution"]: row for row in _list_json()}
    conflict = {"kind": "reward", "name": "f1"}
    for distribution in ("rl-plugin-a", "rlsdk-rm-hub"):
        [found] = rows[distribution]["conflicts"]
        assert {k: found[k] for k in conflict} == conflict and len(found["providers"]) == 2
    assert rows["rlsdk-filter-hub"]["conflicts"] == []


def test_show_says_which_plugins_failed_to_load(fake_dist):
    fake_dist("rl-plugin-broken", "0.1.0", "broken", "rl_plugin_broken", "raise ImportError('boom')\n")
    result = runner.invoke(app, ["plugins", "show", "broken_reward"])
    assert result.exit_code == 2
    assert "broken from rl-plugin-broken 0.1.0 failed to load: ImportError: boom" in " ".join(result.output.split())
