"""The outer loop behind ``rlsdk run``: the data checked, the engine up, then each step in order
(rollout -> train -> sync -> eval -> checkpoint), outputs written and the run state saved."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from ..config import RolloutConfig
from ..data import BadRowPolicy, DataPath, DataSource, Row, read_rows
from ..errors import DataError, RlsdkError
from ..plugins.calls import call_eval_rollout, call_generate_rollout
from ..plugins.manager import RlsdkPluginManager
from ..report import RunReport
from ..runtime import Runtime
from ..training.session import TrainingSession
from ..types import RolloutFnEvalOutput
from .output import RunOutput, warn_changed_plugins
from .session import running

SHOWN_CAUSES = 3
"""Distinct causes a failed step's error quotes; the rest are in discarded.jsonl."""


def run_job(
    args: RolloutConfig,
    pm: RlsdkPluginManager | None = None,
    *,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    on_eval: Callable[[int, dict[str, Any]], None] | None = None,
    progress: Callable[[int], None] | None = None,
    on_status: Callable[[str], None] | None = None,
) -> RunOutput:
    """Run ``args.num_rollout`` steps (continuing a saved run with ``args.resume``). ``on_status`` hears
    what the run is doing: setting up, then ``step N`` as step N (the ``rollout_id``) starts."""
    status = on_status or (lambda text: None)
    rows = check_data(args)  # an empty or unreadable dataset fails before the engine starts
    output = RunOutput(args.output_dir)
    if not args.resume:
        output.start_fresh(args.overwrite)  # so does an output folder holding another run
    loading = " (loading the model)" if args.engine == "embedded" else ""
    status(f"starting the {args.engine} engine{loading}")
    with running(args, pm) as runtime, ExitStack() as closing:
        status("reading the data")
        plugins = runtime.plugins
        runtime.progress = progress
        output.on_saved.append(lambda state: setattr(runtime, "saved_state", state))
        runtime.on_state_saved = output.on_saved
        data_source = DataSource(
            args,
            plugins=plugins,
            tokenizer=runtime.tokenizer,
            keep_messages=plugins.generate_rollout.record.chat_messages,
            read=rows,
        )
        check_images(runtime, data_source)
        if args.train:
            status("loading the trainer")
        training = TrainingSession(args, runtime, output.folder) if args.train else None
        if training is not None:
            closing.callback(training.close)  # before the engine closes
        report = RunReport(output.folder, args.report_to) if args.train else None
        first = 0
        if args.resume:
            state = runtime.saved_state = output.load_state()
            data_source.load_state_dict(state["data"])
            first = state["next_rollout_id"]
            warn_changed_plugins(state.get("plugins", {}), runtime.pm)
            if training is not None and state.get("checkpoint"):
                training.restore(output.checkpoint_path(state))
        else:
            if training is not None and args.eval_interval:  # the curve's starting point
                status("eval before the first step")
                output.write_eval(-1, run_eval(args, runtime, -1))
            output.save_state(output.run_state(0, data_source.state_dict(), args, runtime.pm))
        for rollout_id in range(first, args.num_rollout):
            status(f"step {rollout_id}")
            # generate_rollout: one whole step
            result = call_generate_rollout(runtime, plugins.generate_rollout, args, rollout_id, data_source)
            if training is not None and result.samples:
                status(f"step {rollout_id}: training")
                # trainer: learn from the kept groups, sync the engine, check it serves the new weights
                result.metrics.update(training.train(rollout_id, result))
            output.write_step(rollout_id, result)
            state = output.run_state(rollout_id + 1, data_source.state_dict(), args, runtime.pm)
            if training is None:
                output.save_state(state)
            check_step(args, rollout_id, result.metrics)
            if on_step is not None:
                on_step(rollout_id, result.metrics)
            last = rollout_id + 1 == args.num_rollout
            if args.eval_interval and ((rollout_id + 1) % args.eval_interval == 0 or last):
                status(f"eval after step {rollout_id}")
                evaluated = run_eval(args, runtime, rollout_id)
                output.write_eval(rollout_id, evaluated)
                result.metrics.update(evaluated.metrics)
                if on_eval is not None:
                    on_eval(rollout_id, evaluated.metrics)
            if training is not None and training.checkpoint_due(rollout_id):
                # A training run resumes from its last checkpoint: state.json moves only with one.
                output.set_checkpoint(state, training.save(rollout_id, state))
                output.save_state(state)
            if report is not None:
                report.add(rollout_id, result.metrics)
        if report is not None:
            report.close()
    return output


def check_step(args: RolloutConfig, rollout_id: int, metrics: dict[str, Any]) -> None:
    """A step whose every sample failed stops the run with the causes (``on_failed_step=fail``), after
    the step's samples and the run's state are written."""
    failed = metrics.get("ledger/failed", 0)
    if failed and failed == metrics.get("ledger/entered") and args.on_failed_step == "fail":
        causes = list(dict.fromkeys(metrics.get("rollout/failures", [])))
        shown = "; ".join(causes[:SHOWN_CAUSES]) or "unknown"
        if len(causes) > SHOWN_CAUSES:
            shown += f"; {len(causes) - SHOWN_CAUSES} more in discarded.jsonl"
        requeued = metrics.get("ledger/requeued", 0)
        kept_data = (
            (
                f"; their prompts are not used up ({requeued} samples back in the data, served again on "
                "--resume)"
            )
            if requeued
            else ""
        )
        raise RlsdkError(
            f"step {rollout_id}: all {failed} samples failed ({shown}); the samples are in "
            f"discarded.jsonl{kept_data} (--on-failed-step continue goes on)"
        )


def check_data(args: RolloutConfig) -> tuple[list[Row], BadRowPolicy]:
    """Read the training data's rows once, without a tokenizer: bad rows and empty files fail before the
    engine starts. The data source takes these rows (the file is read once)."""
    if not args.prompt_data:
        raise DataError("no training data: set prompt_data (--data) to a JSONL or Parquet file")
    data_path = DataPath.parse(args.prompt_data)
    bad = BadRowPolicy(args.on_bad_row)
    rows = read_rows(data_path, bad)
    if not rows:
        raise DataError(f"{data_path}: the dataset has no rows")
    return rows, bad


def check_images(runtime: Runtime, data_source: Any) -> None:
    """Prompts with images need a model with image understanding: say so before generating."""
    if not data_source.has_images:
        return
    info = runtime.run(runtime.engine.model_info())
    if not info.get("has_image_understanding"):
        raise DataError(
            f"{data_source.data_path} has prompts with images, but the engine's model "
            f"{info.get('model_path')!r} cannot take images (no image understanding): "
            f"use a vision-language model"
        )


def run_eval(args: RolloutConfig, runtime: Runtime, rollout_id: int) -> RolloutFnEvalOutput:
    """generate_rollout with ``evaluation=True`` (the eval function, else the rollout function)."""
    return call_eval_rollout(runtime, runtime.plugins.eval_rollout, args, rollout_id)
