"""What a newcomer hits first (issue 20, item 6): errors instead of tracebacks, defaults in --help, a run
folder that is never silently replaced, step tables that fit 80 columns."""

import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rlsdk import Sample
from rlsdk.errors import RlsdkError
from rlsdk.outputs import STATE_FILE
from rlsdk.run.output import RunOutput
from rlsdk.rollout.step import group_rewards, scored_reward_metrics
from rlsdk_cli.app import app
from rlsdk_cli.run import step_table

runner = CliRunner()


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("missing.yaml", None, "config file missing.yaml: No such file or directory"),
        ("broken.yaml", "rollout_batch_size: [1,\n", "config file broken.yaml does not parse"),
        ("broken.toml", "rollout_batch_size = \n", "config file broken.toml does not parse"),
    ],
)
def test_a_bad_config_file_is_one_line_not_a_traceback(tmp_path, monkeypatch, name, text, message):
    monkeypatch.chdir(tmp_path)
    if text is not None:
        (tmp_path / name).write_text(text)
    result = runner.invoke(app, ["run", "--config", name], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and message in re.sub(r"[│\s]+", " ", result.output)
    assert "Traceback" not in result.output and not isinstance(result.exception, (OSError, ValueError))


def test_run_help_shows_the_defaults():
    result = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    text = re.sub(r"[│\s]+", " ", result.output)  # help text wraps inside the panel's borders
    for default in ("(default: math)", "(default: embedded)", "(default: pop_first)", "(default: 3)"):
        assert default in text
    assert re.search(r"--num-rollout\s.*steps to run\. \(default: 3\)", result.output)


def test_a_folder_holding_a_run_is_replaced_only_with_overwrite(tmp_path):
    output = RunOutput(tmp_path)
    output.append("rollouts.jsonl", [{"rollout_id": 0}])
    (tmp_path / STATE_FILE).write_text("{}")
    with pytest.raises(RlsdkError, match="holds a run .*--resume continues it, --overwrite replaces it"):
        output.start_fresh()
    assert (tmp_path / "rollouts.jsonl").exists()
    output.start_fresh(overwrite=True)
    assert not any(tmp_path.iterdir())
    RunOutput(tmp_path / "new").start_fresh()  # an empty or new folder needs nothing


def test_rewards_before_the_filter_and_the_groups_spread():
    kept = group_rewards(None, [[Sample(reward=1.0), Sample(reward=0.0)]])
    dropped = group_rewards(None, [[Sample(reward=1.0), Sample(reward=1.0)], [Sample(reward=None)]])
    assert scored_reward_metrics(kept, dropped) == {
        "rollout/reward_mean": 0.5,
        "rollout/reward_mean_before_filter": 0.75,
        "rollout/reward_group_std_mean": 0.25,
        "rollout/reward_min": 0.0,
        "rollout/reward_max": 1.0,
        "rollout/groups_with_spread": 1,
    }


def test_the_step_table_keeps_every_drop_reason_whole_at_80_columns():
    console = Console(width=80, record=True)
    console.print(
        step_table(
            7,
            {
                "rollout/reward_mean": 0.5,
                "ledger/kept": 64,
                "ledger/dropped": 24,
                "ledger/returned": 16,
                "ledger/failed": 0,
                "rollout/tokens_per_s": 12345.6,
                "rollout/seconds": 151.2,
                "rollout/aborted": 3,
                "rollout/dynamic_filter/drop_check_reward_nonzero_std": 16,
                "rollout/dynamic_filter/drop_invalid_reward": 8,
            },
        )
    )
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text
    assert "dropped: check_reward_nonzero_std 16, invalid_reward 8; aborted 3" in text
    assert "step 7" in text and "returned" in text
