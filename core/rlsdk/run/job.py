"""The outer loop behind ``rlsdk run``: the data checked, the engine up, then each step in order
(rollout -> train -> sync -> eval -> checkpoint), outputs written and the run state saved."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from ..config import RolloutConfig
from ..data import BadRowPolicy, DataPath, Row, read_rows
from ..errors import DataError
from ..plugins.manager import RlsdkPluginManager
from ..report import RunReport
from ..runtime import Runtime
from ..training.session import TrainingSession
from ..training_options import overlapped
from .extensions import build_data_source, load_data_state, log_eval, source_state, uses_core_data_source
from .folder import check_data_unchanged, data_fingerprint, folder_lock
from .output import RunOutput, warn_changed_plugins
from .overlap import run_overlapped
from .preemption import stop_on_signals
from .session import running
from .steps import StepRecorder, check_step, run_eval

LABEL_KEYS = ("label", "answer", "solution", "ground_truth")
"""Row keys that look like a label, for the warning when ``--label-key`` is not set."""

__all__ = ["check_data", "check_images", "check_step", "run_eval", "run_job", "run_steps"]


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
    # an empty or unreadable dataset fails before the engine starts
    rows = check_data(args) if uses_core_data_source(args) else None
    output = RunOutput(args.output_dir)
    with folder_lock(output.folder):  # a second run on this folder fails at once, naming this one (T20)
        return _run_job(args, pm, output, rows, on_step, on_eval, progress, on_status)


def _run_job(
    args: RolloutConfig,
    pm: RlsdkPluginManager | None,
    output: RunOutput,
    rows: tuple[list[Row], BadRowPolicy] | None,
    on_step: Callable[[int, dict[str, Any]], None] | None,
    on_eval: Callable[[int, dict[str, Any]], None] | None,
    progress: Callable[[int], None] | None,
    on_status: Callable[[str], None] | None,
) -> RunOutput:
    status = on_status or (lambda text: None)
    data_file = (
        data_fingerprint(DataPath.parse(args.prompt_data).path)
        if args.prompt_data and uses_core_data_source(args)
        else None
    )
    if not args.resume:
        output.start_fresh(args.overwrite)  # so does an output folder holding another run
    engine = args.choices["engine"]
    loading = " (loading the model)" if engine == "embedded" else ""
    status(f"starting the {engine} engine{loading}")
    with running(args, pm) as runtime, ExitStack() as closing:
        assert runtime.args is not None
        args = runtime.args  # the configuration as the run's plugins see it
        status("reading the data")
        runtime.progress = progress
        output.on_saved.append(lambda state: setattr(runtime, "saved_state", state))
        runtime.on_state_saved = output.on_saved
        data_source = build_data_source(args, runtime, rows)  # data_source
        check_images(runtime, data_source)
        if args.train:
            status("loading the trainer")
        training = TrainingSession(args, runtime, output.folder) if args.train else None
        if training is not None:
            closing.callback(training.close)  # before the engine closes
        report = RunReport(output.folder, args.report_to) if args.train else None
        first = 0
        steps = StepRecorder(args, runtime, output, data_source, training, report, on_step, on_eval, status)
        steps.data_file = data_file
        if args.resume:
            state = runtime.saved_state = output.load_state()
            check_data_unchanged(state.get("data_file"), data_file)  # T16
            load_data_state(data_source, state["data"])
            first = state["next_rollout_id"]
            warn_changed_plugins(state.get("plugins", {}), runtime.pm)
            if training is not None and state.get("checkpoint"):
                training.restore(output.checkpoint_path(state))
                steps.last_checkpoint, steps.checkpoint_version = state["checkpoint"], training.weight_version
        else:
            if training is not None and args.eval_interval and not args.skip_eval_before_train:
                status("eval before the first step")
                evaluated = run_eval(args, runtime, -1)
                output.write_eval(-1, evaluated)
                log_eval(args, runtime, -1, evaluated)  # eval_rollout_log
            output.save_state(output.run_state(0, source_state(data_source), args, runtime.pm, data_file))
        with stop_on_signals(runtime.stop):  # SIGTERM, SIGINT: save what is in flight, then stop
            if training is not None and overlapped(args):
                run_overlapped(steps, first)  # --async, --max-policy-version-lag
            else:
                run_steps(steps, first)
        if report is not None:
            report.close()
    return output


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
    missing = [row for row in rows if row.values.get(args.input_key) is None]
    for row in missing:  # a prompt needs its input key: said before the model loads
        bad.report(
            row.where, f"no input key {args.input_key!r} (keys: {sorted(row.values)}; --input-key names it)"
        )
    if len(missing) == len(rows):
        raise DataError(f"{data_path}: no row has the input key {args.input_key!r} (--input-key names it)")
    if args.label_key is None and any(key in rows[0].values for key in LABEL_KEYS):
        key = next(key for key in LABEL_KEYS if key in rows[0].values)
        warnings.warn(
            f"{data_path} has a {key!r} key but no --label-key is set: rewards see no label "
            f"(--label-key {key} gives it to them)",
            stacklevel=2,
        )
    return [row for row in rows if row.values.get(args.input_key) is not None], bad


def check_images(runtime: Runtime, data_source: Any) -> None:
    """Prompts with images need a model with image understanding: say so before generating."""
    if not getattr(data_source, "has_images", False):
        return
    info = runtime.run(runtime.engine.model_info())
    if not info.get("has_image_understanding"):
        raise DataError(
            f"{data_source.data_path} has prompts with images, but the engine's model "
            f"{info.get('model_path')!r} cannot take images (no image understanding): "
            f"use a vision-language model"
        )


def run_steps(steps: StepRecorder, first: int) -> None:
    """The synchronous loop, its five verbs in order as in slime's ``train.py``: rollout, train, sync, eval,
    checkpoint (the overlapped loop, :mod:`.overlap`, runs the same verbs in two threads)."""
    args, runtime, training = steps.args, steps.runtime, steps.training
    for rollout_id in range(first, args.num_rollout):
        steps.status(f"step {rollout_id}")
        result = steps.rollout(rollout_id)  # generate_rollout: one whole step
        if training is not None and result.samples:
            steps.status(f"step {rollout_id}: training")
            result.metrics.update(training.train(rollout_id, result))  # trainer: learn from the kept groups
            result.metrics.update(training.publish(result))  # sync: weights to every engine, trust check
        state = steps.record(rollout_id, result, source_state(steps.data_source))  # outputs, run state
        steps.evaluate(rollout_id, result, state)  # eval, when due
        steps.checkpoint(rollout_id, result, state)  # checkpoint, when due
        if runtime.stop.is_set:
            steps.stop(rollout_id + 1, [])
