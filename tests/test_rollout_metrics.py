"""The ``rollout_metrics`` kind, added by its declaration (``rlsdk.plugins.kinds.rollout.RolloutMetrics``), the
loop's one call (``run/steps.py``, where the default, no metrics of a task's own, lives) and this file:
everything else a kind has (its hook, its option on the command line, its resolution and call point, its
testing check, its scaffold example and its row in the docs) comes from the declaration, and is checked here.
Generation runs on rlsdk.testing's FakeEngine: the loop around the kind is what is tested, not a model."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlsdk import Engine, Reward, RolloutConfig, RolloutMetrics, Sample, get_plugin_manager, hookimpl
from rlsdk.errors import PluginCallError, UnknownPluginError
from rlsdk.run.job import run_job
from rlsdk.testing import FakeEngine, check_plugin
from rlsdk_cli.app import app
from rlsdk_cli.scaffold import SCAFFOLD_KINDS, example

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
import docs_generate  # noqa: E402


def answered_share(args, rollout_id, samples):
    """The share of samples whose response holds the label."""
    hits = sum(str(s.label) in (s.response or "") for s in samples)
    return {"answered": hits / len(samples), "step": rollout_id}


class Plugins:
    @hookimpl
    def rlsdk_rollout_metrics(self):
        yield RolloutMetrics(name="answered", func=answered_share)
        yield RolloutMetrics(name="lengths", func=lambda args, rollout_id, samples: {"n": len(samples)})
        yield RolloutMetrics(name="not_a_number", func=lambda args, rollout_id, samples: {"x": "high"})

    @hookimpl
    def rlsdk_rewards(self):
        yield Reward(name="has_x", func=lambda args, sample: float("x" in sample.response))

    @hookimpl
    def rlsdk_engines(self):
        yield Engine(name="fake", func=lambda args: FakeEngine(lambda payload, call: "x is the answer"))


@pytest.fixture
def pm():
    return get_plugin_manager(load_entrypoints=False, plugins=[Plugins()])


def run(tmp_path, pm, **options):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"input": f"{i}|", "label": "x"}) + "\n" for i in range(4)))
    args = RolloutConfig(
        engine="fake",
        prompt_data=str(data),
        label_key="label",
        rm_type="has_x",
        num_rollout=2,
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        output_dir=str(tmp_path / "out"),
        **options,
    )
    run_job(args, pm)
    return [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]


def test_each_step_adds_the_plugins_metrics_in_order(tmp_path, pm):
    rows = run(tmp_path, pm, rollout_metrics=["answered", "lengths"])
    steps = [row for row in rows if "custom/answered" in row]
    assert [(r["custom/answered"], r["custom/step"], r["custom/n"]) for r in steps] == [(1.0, 0, 4), (1.0, 1, 4)]


def test_a_metric_that_is_not_a_number_stops_the_run_naming_the_plugin(tmp_path, pm):
    with pytest.raises(PluginCallError, match="rollout_metrics 'not_a_number'.*at rollout 0.*'x': 'high'"):
        run(tmp_path, pm, rollout_metrics=["not_a_number"])


def test_an_unknown_name_fails_before_the_engine_starts(tmp_path, pm):
    with pytest.raises(UnknownPluginError, match="unknown rollout_metrics 'answerd'.*did you mean 'answered'"):
        run(tmp_path, pm, rollout_metrics=["answerd"])


def test_the_testing_kit_checks_it_through_the_same_call_point(pm):
    samples = [Sample(response="x", label="x"), Sample(response="y", label="x")]
    assert check_plugin(pm, "rollout_metrics", "answered", RolloutConfig(), 3, samples) == {
        "answered": 0.5,
        "step": 3,
    }
    with pytest.raises(PluginCallError, match="not finite numbers"):
        check_plugin(pm, "rollout_metrics", "not_a_number", RolloutConfig(), 0, samples)


def test_everything_else_comes_from_the_declaration(pm):
    """The hook, the command-line option, the scaffold's example and the docs' row; slime has no such
    extension point, so no ``rlsdk.slime.rollout_metrics`` module (its declaration says ``slime = False``)."""
    assert "rlsdk_rollout_metrics" in {h for h in dir(pm.hook) if h.startswith("rlsdk_")}
    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert "--rollout-metrics" in result.output
    assert "rollout_metrics" in SCAFFOLD_KINDS and example("rollout_metrics")[3] == "boxed_share"
    assert "| `rlsdk_rollout_metrics` | `RolloutMetrics` |" in docs_generate.kinds_table()
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("rlsdk.slime.rollout_metrics")
