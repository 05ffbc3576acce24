"""The flag audit (issue 56): every option of every command is read by it or refused by name. Static checks
(each command's own parameters appear in its body; the lazily loaded commands are the ones the eager app
made) and the refusals themselves, all before any model loads."""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from rlsdk.config import core_options
from rlsdk_cli import buffer, export, plugins, run, score, serve, tinker, view
from rlsdk_cli.app import SUBCOMMANDS, app, load_subcommand
from rlsdk_cli.flags import EVAL_UNUSED, STEP_ONLY, TRAINING_ONLY

runner = CliRunner()


def commands(command: Any, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], Any]]:
    """Every leaf command under ``command`` (typer's click commands), with its path of names."""
    if hasattr(command, "commands"):
        return [
            pair for name, sub in sorted(command.commands.items()) for pair in commands(sub, (*path, name))
        ]
    return [(path, command)]


def signature(command: Any) -> list[tuple[str, tuple[str, ...], bool]]:
    return [(p.name or "", tuple(p.opts), bool(getattr(p, "hidden", False))) for p in command.params]


def test_the_lazy_commands_are_the_ones_the_eager_app_made():
    """``rlsdk buffer serve`` stays a group's command and no subcommand gains completion options."""
    eager = typer.Typer(add_completion=False)
    eager.add_typer(plugins.app, name="plugins")
    eager.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run.run)
    eager.command("eval")(run.evaluate)
    for name, func in (("score", score.score), ("serve", serve.serve), ("export", export.export)):
        eager.command(name)(func)
    eager.command("view")(view.view)
    eager.add_typer(buffer.app, name="buffer")
    eager.add_typer(tinker.app, name="tinker")
    made = commands(typer.main.get_group(eager), ())
    lazy = [pair for name in SUBCOMMANDS for pair in commands(load_subcommand(name), (name,))]
    assert [(path, signature(c)) for path, c in sorted(lazy)] == [(path, signature(c)) for path, c in made]
    assert load_subcommand("run").context_settings["ignore_unknown_options"]


def test_every_parameter_of_every_command_is_read_by_it():
    """A parameter its function never names does nothing. ``rlsdk run`` and ``eval`` take the run options as
    ``**options`` into their configuration (each a RolloutConfig or plugin option); eval refuses those it does
    not use (below)."""
    unread = {}
    for name in SUBCOMMANDS:
        for path, command in commands(load_subcommand(name), (name,)):
            func = command.callback
            assert func is not None
            tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
            body = {n.id for stmt in tree.body[0].body for n in ast.walk(stmt) if isinstance(n, ast.Name)}  # type: ignore[attr-defined]
            code = func.__code__  # the def's own parameters (run's and eval's signature adds the run options)
            own = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
            unread[" ".join(path)] = [p for p in own if p not in body]
    assert all(not v for v in unread.values()), unread


def test_eval_hides_and_refuses_exactly_what_it_does_not_use():
    eval_command = load_subcommand("eval")
    hidden = {p.name for p in eval_command.params if getattr(p, "hidden", False)}
    assert hidden == EVAL_UNUSED & set(core_options())
    assert {"train", "lora_rank", "train_async", "lr", "checkpoint_callback", "num_rollout"} <= hidden
    assert (
        not {"eval_temperature", "custom_eval_rollout_log_function_path", "rm_type", "prompt_data"} & hidden
    )
    assert not any(
        p.name in EVAL_UNUSED for p in load_subcommand("run").params if getattr(p, "hidden", False)
    )
    assert TRAINING_ONLY.isdisjoint(STEP_ONLY)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--train"], "--train (rlsdk run's, for its training)"),
        (["--lora-rank", "8"], "--lora-rank"),
        (["--async"], "--train-async"),
        (["--set", "rollout_batch_size=8"], "--rollout-batch-size (rlsdk run's, for its steps)"),
        (["--dynamic-filter", "x"], "--dynamic-sampling-filter-path"),
    ],
)
def test_eval_refuses_the_options_it_does_not_use_by_name(argv, named):
    result = runner.invoke(app, ["eval", *argv])
    assert result.exit_code == 2 and "rlsdk eval does not use" in result.output
    assert named in " ".join(result.output.replace("│", " ").split())


@pytest.mark.parametrize("argv", [["--lr", "1e-5"], ["--lora-rank", "4"], ["--set", "kl_loss_coef=0.1"]])
def test_a_run_that_does_not_train_refuses_training_options(argv):
    refused = runner.invoke(app, ["run", *argv, "--print-config"])
    assert refused.exit_code == 2 and "applies only with --train" in refused.output
    trained = runner.invoke(app, ["run", "--train", *argv, "--print-config"])
    assert trained.exit_code == 0, trained.output


def test_trust_folder_without_resume_is_refused():
    result = runner.invoke(app, ["run", "--trust-folder", "--print-config"])
    assert result.exit_code == 2 and "--trust-folder applies only with --resume" in result.output
