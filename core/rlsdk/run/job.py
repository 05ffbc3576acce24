"""The outer loop behind ``rlsdk run``: the data checked, the engine up, then each step in order
(rollout -> train -> sync -> eval -> checkpoint), outputs written and the run state saved."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from ..config import RolloutConfig, recording_option_reads, uses_core_data_source
from ..data import BadRowPolicy, DataPath, Row
from ..data.rows import checked_rows
from ..errors import DataError
from ..plugins.loading import refusing_code
from ..plugins.manager import RlsdkPluginManager
from ..report import RunReport
from ..runtime import Runtime
from ..state_files import signed_here, strings_in
from ..training.session import TrainingSession, checkpoint_root
from ..training_options import named_model_folder, overlapped
from .determinism import deterministic_run
from .extensions import build_data_source, load_data_state, source_state
from .folder import (
    check_base_model_unchanged,
    check_data_unchanged,
    data_fingerprint,
    folder_lock,
    model_fingerprint,
)
from .output import RunOutput, untrusted_texts, warn_changed_plugins
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
    trust_folder: bool = False,
) -> RunOutput:
    """Run ``args.num_rollout`` steps (continuing a saved run with ``args.resume``). ``on_status`` hears
    what the run is doing: setting up, then ``step N`` as step N (the ``rollout_id``) starts. A saved state
    this machine did not sign names no code the run loads, unless ``trust_folder``."""
    # an empty or unreadable dataset fails before the engine starts
    rows = check_data(args) if uses_core_data_source(args) else None
    output = RunOutput(args.output_dir, save=args.save)
    with ExitStack() as held:
        # a second run on a folder this one writes fails at once, naming this one (T20)
        held.enter_context(folder_lock(output.folder))
        checkpoints = checkpoint_root(args, output.folder)
        if args.train and not checkpoints.resolve().is_relative_to(output.folder.resolve()):
            held.enter_context(folder_lock(checkpoints, role="--save"))
        return _run_job(args, pm, output, rows, on_step, on_eval, progress, on_status, trust_folder)


def _run_job(
    args: RolloutConfig,
    pm: RlsdkPluginManager | None,
    output: RunOutput,
    rows: tuple[list[Row], BadRowPolicy] | None,
    on_step: Callable[[int, dict[str, Any]], None] | None,
    on_eval: Callable[[int, dict[str, Any]], None] | None,
    progress: Callable[[int], None] | None,
    on_status: Callable[[str], None] | None,
    trust_folder: bool,
) -> RunOutput:
    status = on_status or (lambda text: None)
    data_file = (
        data_fingerprint(DataPath.parse(args.prompt_data).path)
        if args.prompt_data and uses_core_data_source(args)
        else None
    )
    base_model = model_fingerprint(named_model_folder(args)) if args.train and args.lora_rank else None
    output.inputs = {"data_file": data_file, "base_model": base_model}
    saved: dict[str, Any] = {}
    if args.resume:  # the saved state is checked before anything is done with it
        saved = output.load_state()
        check_data_unchanged(saved.get("data_file"), data_file)  # T16
        check_base_model_unchanged(saved.get("base_model"), base_model)
        if not signed_here(saved):
            warnings.warn(not_signed_here(output, trust_folder), stacklevel=2)
    else:
        output.start_fresh(args.overwrite)  # so does an output folder holding another run
    # code a state this machine did not sign names (a sample of its buffer) is never loaded
    settings = saved.get("settings")
    skip = list(settings) if isinstance(settings, dict) else []  # the settings are the CLI's to refuse
    untrusted = {} if trust_folder or not saved else untrusted_texts(output.folder, saved, skip=skip)
    engine = args.choices["engine"]
    loading = " (loading the model)" if engine == "embedded" else ""
    status(f"starting the {engine} engine{loading}")
    with (
        deterministic_run(args, output),  # --deterministic: seeds, kernels, wall clocks apart (for this run)
        recording_option_reads() as read,  # what the run's plugins use of the options given
        refusing_code(untrusted, allowed=strings_in(args.to_dict())),
        running(args, pm) as runtime,
        ExitStack() as closing,
    ):
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
        if args.resume:
            state = runtime.saved_state = saved
            load_data_state(data_source, state["data"])
            first = state["next_rollout_id"]
            warn_changed_plugins(state.get("plugins", {}), runtime.pm)
            if training is not None and state.get("checkpoint"):
                training.restore(output.check_checkpoint(state))  # each file as it was saved
                steps.last_checkpoint, steps.checkpoint_version = state["checkpoint"], training.weight_version
        else:
            if training is not None and args.eval_interval and not args.skip_eval_before_train:
                steps.evaluate_before_training()
            output.save_state(output.run_state(0, source_state(data_source), args, runtime.pm))
        with stop_on_signals(runtime.stop):  # SIGTERM, SIGINT: save what is in flight, then stop
            if training is not None and overlapped(args):
                run_overlapped(steps, first)  # --async, --max-policy-version-lag
            else:
                run_steps(steps, first)
        steps.detectors.check_options_read(read, runtime.pm)
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
    rows = checked_rows(data_path, bad, args.input_key, "--input-key")
    if args.label_key is not None:  # a column named but absent: rewards would see no label, silently
        unlabelled = [row for row in rows if row.values.get(args.label_key) is None]
        if len(unlabelled) == len(rows):
            raise DataError(
                f"{data_path}: no row has the label key {args.label_key!r} (--label-key); its keys: "
                f"{sorted(rows[0].values)}"
            )
        if unlabelled:
            warnings.warn(
                f"{data_path}: {len(unlabelled)} of {len(rows)} rows have no label key {args.label_key!r} "
                f"(the first at {unlabelled[0].where}): their rewards see no label",
                stacklevel=2,
            )
    if args.label_key is None and any(key in rows[0].values for key in LABEL_KEYS):
        key = next(key for key in LABEL_KEYS if key in rows[0].values)
        warnings.warn(
            f"{data_path} has a {key!r} key but no --label-key is set: rewards see no label "
            f"(--label-key {key} gives it to them)",
            stacklevel=2,
        )
    return rows, bad


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


def not_signed_here(output: RunOutput, trust_folder: bool) -> str:
    """What ``--resume`` says on a state this machine did not sign: what it checked, and what it refuses."""
    code = (
        "code it names is loaded as you trust the folder (--trust-folder)"
        if trust_folder
        else "code it names is loaded only where the command line names it again (--trust-folder trusts the folder)"
    )
    return (
        f"--resume: {output.folder / 'state.json'} was not written by rlsdk on this machine (another machine's, "
        "or edited since): resuming what can be checked: the output files cut to their recorded sizes, the "
        f"data position, and the checkpoint's files against their recorded fingerprints (formats that hold no "
        f"code only); {code}"
    )
