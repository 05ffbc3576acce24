"""The house's rules (issue 46), checked on the code: the configuration is a plain frozen value in sections,
never written by a run; the run's plugins are made in a few known places; core's own signatures type the
run's ``args``."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from rlsdk import RolloutConfig, get_plugin_manager
from rlsdk.options import SECTIONS
from rlsdk.run.job import run_job

from .test_rollout_metrics import Plugins  # a reward and an engine on rlsdk.testing's FakeEngine

CORE = Path(__file__).resolve().parents[1] / "core" / "rlsdk"


def core_sources() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text())) for path in sorted(CORE.rglob("*.py"))]


def test_the_configuration_is_frozen_and_a_change_is_a_new_value():
    args = RolloutConfig(rm_type="exact", lr=0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.lr = 1.0  # type: ignore[misc]
    changed = args.replace(lr=0.25, rm_type="math", rollout_batch_size=2)
    assert (args.lr, args.rm_type) == (0.5, "exact") and (changed.lr, changed.rm_type) == (0.25, "math")
    with pytest.raises(ValueError, match="rollout_batch_size must be at least 1"):
        args.replace(rollout_batch_size=0)


def test_every_option_is_in_one_section_and_reads_both_ways():
    names = [f.name for section in SECTIONS.values() for f in dataclasses.fields(section)]
    assert len(names) == len(set(names))
    fields = {f.name for f in dataclasses.fields(RolloutConfig)} - {"choices", "extra"}
    assert set(names) == fields
    args = RolloutConfig(lr=0.5, tensor_model_parallel_size=2, max_turns=7, label_key="answer")
    sections = args.sections
    assert (sections.training.lr, sections.megatron.tensor_model_parallel_size) == (0.5, 2)
    assert (sections.agents.max_turns, sections.data.label_key) == (7, "answer")
    assert all(dataclasses.is_dataclass(s) and type(s).__dataclass_params__.frozen for s in vars(sections).values())


def test_a_run_never_writes_its_configuration(tmp_path):
    """What the run learns (the engine's address, the model's folder) reaches plugins through the run's view
    of the configuration (``runtime.args``); the configuration it was given is the same value after."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"input": f"{i}|", "label": "x"}) + "\n" for i in range(2)))
    args = RolloutConfig(
        engine="fake", prompt_data=str(data), rm_type="has_x", num_rollout=1, rollout_batch_size=2,
        n_samples_per_prompt=2, output_dir=str(tmp_path / "out"),
    )
    before = args.to_dict()
    run_job(args, get_plugin_manager(load_entrypoints=False, plugins=[Plugins()]))
    assert args.to_dict() == before and args.sglang_router_ip is None and "_rlsdk_runtime" not in vars(args)


def test_the_run_plugins_are_made_only_where_a_run_or_a_process_starts():
    """``RunPlugins`` is built by the run's session, ``rlsdk score``, a runtime without plugins of its own,
    ``plugins_of`` outside a run, a Ray reward worker and the testing kit: nothing below rebuilds it."""
    makers = {
        str(path.relative_to(CORE.parent.parent))
        for path, tree in core_sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "RunPlugins"
    }
    assert makers == {
        "core/rlsdk/run/session.py",
        "core/rlsdk/runtime.py",
        "core/rlsdk/ray/task_pool.py",
        "core/rlsdk/testing.py",
        "core/rlsdk/testing_kinds.py",
    }


def test_core_signatures_type_the_runs_args():
    """No ``args: Any`` in core's own signatures (the run's configuration is ``RolloutConfig``, or
    ``RunOptions`` below the config's floor; slime's own ``args``, where slime calls rlsdk, is
    ``argparse.Namespace``)."""
    untyped = [
        f"{path.relative_to(CORE)}:{node.lineno}"
        for path, tree in core_sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        if arg.arg == "args" and arg.annotation is not None and ast.unparse(arg.annotation) == "Any"
    ]
    assert not untyped, f"type the run's args (RolloutConfig, RunOptions or argparse.Namespace): {untyped}"


def function_lengths() -> dict[str, int]:
    return {
        f"{path.relative_to(CORE)}:{node.name}": node.end_lineno - node.lineno + 1  # type: ignore[operator]
        for path, tree in core_sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def test_no_core_function_is_over_80_lines_and_the_step_reads_in_one_screen():
    lengths = function_lengths()
    assert {name: n for name, n in lengths.items() if n > 80} == {}
    step = {name: n for name, n in lengths.items() if name.startswith("rollout/step.py:")}
    assert step["rollout/step.py:rollout_step"] <= 60 and max(step.values()) <= 60, step
