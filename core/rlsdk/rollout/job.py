"""The main job behind ``rlsdk run``: engine up, steps in order, outputs written, state saved."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ..errors import RlsdkError
from ..plugins.calls import call_engine, call_eval_rollout, call_generate_rollout
from ..plugins.manager import RlsdkPluginManager, get_plugin_manager
from ..plugins.records import Resolved
from ..report import RunReport
from ..runtime import Runtime, bind_runtime, tuned_garbage_collector
from ..training.options import loss_spec
from ..types import RolloutFnEvalOutput, RolloutFnTrainOutput, Sample

STATE_FILE = "state.json"
STATE_SAVED = "state_saved"
"""``runtime.state`` key of the callables run with each run state once it is on disk: a rollout that took
data from a service acknowledges it there only when a saved state covers its step."""
LABEL_KEYS = ("label", "answer", "solution", "ground_truth")
"""Row keys that look like a label, for the warning when ``--label-key`` is not set."""
SHOWN_CAUSES = 3
"""Distinct causes a failed step's error quotes; the rest are in discarded.jsonl."""


def resolve_run_plugins(args: Any, pm: RlsdkPluginManager) -> dict[str, Resolved]:
    """Resolve every plugin the run names, so a wrong name fails before any model loads."""
    from .rewarding import resolve_reward

    resolved = {
        "generate_rollout": pm.resolve("generate_rollout", args.rollout_function_path),
        "engine": pm.resolve("engine", engine_name(args)),
    }
    if (
        args.train
    ):  # a trainer builds its own loss from args; resolved here too, to fail before any model loads
        resolved["trainer"] = pm.resolve("trainer", args.trainer)
        resolved["loss"] = pm.resolve("loss", loss_spec(args))
        check = resolved["trainer"].record.check
        if check is not None:  # settings the trainer cannot take fail before the engines start
            check(args)
    if args.eval_function_path:
        resolved["eval"] = pm.resolve("generate_rollout", args.eval_function_path)
    if args.custom_generate_function_path:
        resolved["custom_generate"] = pm.resolve("custom_generate", args.custom_generate_function_path)
    if args.agent_function_path:
        resolved["agent"] = pm.resolve("agent", args.agent_function_path)
    if args.custom_rm_path:
        resolved["reward"] = resolve_reward(pm, args.custom_rm_path, group=args.group_rm)
    else:
        resolved["reward"] = resolve_reward(pm, args.rm_type)
    for kind, spec in (
        ("dynamic_filter", args.dynamic_sampling_filter_path),
        ("over_sampling_filter", args.over_sampling_filter_path),
        ("buffer_filter", args.buffer_filter_path),
    ):
        if spec:
            resolved[kind] = pm.resolve(kind, spec)
    return resolved


def engine_name(args: Any) -> str:
    """``--engine URL`` names the ``sglang`` engine, which reads the URL from ``args.engine``."""
    return "sglang" if args.engine.startswith(("http://", "https://")) else args.engine


def open_runtime(args: Any, pm: RlsdkPluginManager, engine: Resolved) -> Runtime:
    """Start the engine and check its health; serve it over HTTP on loopback when it has no URL of its
    own, so slime-style generators that POST to ``/generate`` reach it; load the tokenizer."""
    from ..engines.health import check_engine_health
    from ..engines.server import start_server

    runtime = Runtime(pm, call_engine(engine, args))
    try:
        runtime.run(runtime.engine.start())
        # a dead or broken engine stops the run here, before any data is taken
        runtime.run(check_engine_health(runtime.engine, engine, args.generate_timeout))
        url = runtime.engine.url
        if url is None:
            server = runtime.run(
                start_server(
                    runtime.engine, host="127.0.0.1", port=0, pm=pm, tool_call_parser=args.tool_call_parser
                )
            )
            runtime.state["server"] = server
            url = server.url
        parsed = urlparse(url)
        args.sglang_router_ip, args.sglang_router_port = parsed.hostname, parsed.port
        model_path = getattr(runtime.engine, "model_path", None)
        if not args.hf_checkpoint and model_path:
            args.hf_checkpoint = str(model_path)  # slime's functions load tokenizers from it
        runtime.tokenizer = getattr(runtime.engine, "tokenizer", None) or load_tokenizer(args)
    except BaseException:
        close_runtime(runtime)
        raise
    return bind_runtime(args, runtime)


def load_tokenizer(args: Any) -> Any:
    checkpoint = args.hf_checkpoint or args.model
    if not checkpoint:
        raise ValueError(
            "the engine has no tokenizer: pass --hf-checkpoint with the model's tokenizer folder"
        )
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint)


def close_runtime(runtime: Runtime) -> None:
    servers = [
        runtime.state.pop(key, None) for key in ("server", "agent_endpoint")
    ]  # agent_endpoint: agents/
    try:
        for server in filter(None, servers):
            runtime.run(server.close())
        runtime.run(runtime.engine.close())
    finally:
        runtime.loop.close()


def sample_row(rollout_id: int, sample: Sample) -> dict[str, Any]:
    """A line of rollouts.jsonl: the sample's dict, whose ``rollout_id`` is the step's; the sample's own
    ``rollout_id`` (slime's id of the rollout it came from, set by agents) goes to ``sample_rollout_id``."""
    row = sample.to_dict()
    own = row.pop("rollout_id", None)
    if own is not None:
        row["sample_rollout_id"] = own
    return {"rollout_id": rollout_id, **row}


class RunOutput:
    """The output folder: ``rollouts.jsonl`` (kept samples), ``discarded.jsonl`` (dropped or failed,
    with the reason), ``metrics.jsonl``, ``eval.jsonl`` and ``state.json`` for ``--resume``.

    The state records each file's size after the step it covers; resuming truncates what a crash
    wrote past it, so no step is written twice."""

    FILES = ("rollouts.jsonl", "discarded.jsonl", "metrics.jsonl", "eval.jsonl", "eval_samples.jsonl")

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.on_saved: list[Callable[[dict[str, Any]], None]] = []
        """Called with each state after it is saved (see :data:`STATE_SAVED`)."""

    def load_state(self) -> dict[str, Any]:
        path = self.folder / STATE_FILE
        if not path.exists():
            raise FileNotFoundError(f"--resume: no {STATE_FILE} in {self.folder}; nothing to resume")
        state = json.loads(path.read_text())
        for name, size in state["file_sizes"].items():
            with open(self.folder / name, "a+b") as f:
                f.truncate(size)
        return state

    def start_fresh(self, overwrite: bool = False) -> None:
        """Remove a previous run's files; a folder holding a run is an error unless ``overwrite``."""
        held = [name for name in (STATE_FILE, *self.FILES) if (self.folder / name).exists()]
        if held and not overwrite:
            raise RlsdkError(
                f"{self.folder} holds a run ({', '.join(held)}): --resume continues it, "
                "--overwrite replaces it, or choose another --output"
            )
        for name in (*self.FILES, STATE_FILE):
            (self.folder / name).unlink(missing_ok=True)

    def append(self, name: str, rows: list[dict[str, Any]]) -> None:
        with open(self.folder / name, "a") as f:
            f.writelines(json.dumps(row, default=str) + "\n" for row in rows)

    def write_step(self, rollout_id: int, output: RolloutFnTrainOutput) -> None:
        self.append("rollouts.jsonl", [sample_row(rollout_id, s) for g in output.samples for s in g])
        self.append("discarded.jsonl", [sample_row(rollout_id, s) for g in output.discarded for s in g])
        self.append("metrics.jsonl", [{"rollout_id": rollout_id, **output.metrics}])

    def write_eval(self, rollout_id: int, output: RolloutFnEvalOutput) -> None:
        """The eval's metrics to ``eval.jsonl``, its samples (with their dataset) to
        ``eval_samples.jsonl``."""
        self.append("eval.jsonl", [{"rollout_id": rollout_id, **output.metrics}])
        self.append(
            "eval_samples.jsonl",
            [
                {"dataset": name, **sample_row(rollout_id, s)}
                for name, data in output.data.items()
                if isinstance(data, dict)
                for s in data.get("samples", [])
                if isinstance(s, Sample)
            ],
        )

    def run_state(
        self, next_rollout_id: int, data_state: dict[str, Any], args: Any, pm: RlsdkPluginManager
    ) -> dict[str, Any]:
        """What ``--resume`` needs: the next step, the output files' sizes, the data position and buffer,
        the run's settings and the installed plugins' versions."""
        sizes = {
            name: (self.folder / name).stat().st_size if (self.folder / name).exists() else 0
            for name in self.FILES
        }
        return {
            "next_rollout_id": next_rollout_id,
            "file_sizes": sizes,
            "data": data_state,
            "settings": saved_settings(args),
            "plugins": plugin_versions(pm),
        }

    def save_state(self, state: dict[str, Any]) -> None:
        tmp = self.folder / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(state, default=str))
        os.replace(tmp, self.folder / STATE_FILE)
        for callback in self.on_saved:
            callback(state)


RESUME_MAY_CHANGE = frozenset(
    {
        "num_rollout",
        "resume",
        "output_dir",
        "eval_interval",
        "skip_eval_before_train",
        "keep_last_n",
        "save_interval",
        "report_to",
        "sync_check_tol",
        "sglang_server_concurrency",
        "engine_threads",
        "train_threads",
        "generate_timeout",
        "reward_timeout",
        "grader_workers",
        "grader_timeout",
        "abort_timeout",
        "engine_max_batch_size",
        "ray_address",
        "num_engines",
        "ray_runtime_env",
        "ray_engine_cpus",
        "ray_spare_engines",
        "ray_standby_engines",
        "ray_sync_rewards",
        "ray_start_timeout",
        "rollout_health_check_timeout",
    }
)
"""Options a resumed run may set differently from the saved run; any other given option must match."""


def saved_settings(args: Any) -> dict[str, Any]:
    settings = args.to_dict()
    for key in ("resume", "overwrite", "sglang_router_ip", "sglang_router_port"):
        settings.pop(key, None)
    return settings


def plugin_versions(pm: RlsdkPluginManager) -> dict[str, str | None]:
    """Distribution -> version of every plugin the run loaded."""
    return dict(sorted((info.distribution, info.version) for info in pm.plugin_infos() if info.distribution))


def warn_changed_plugins(saved: dict[str, Any], pm: RlsdkPluginManager) -> None:
    """A resumed run whose plugins changed version since the run was saved may not continue it exactly."""
    now = plugin_versions(pm)
    changed = [
        f"{name} {saved.get(name)} -> {now.get(name)}"
        for name in sorted(set(saved) | set(now))
        if saved.get(name) != now.get(name)
    ]
    if changed:
        import warnings

        warnings.warn(
            f"--resume: plugins changed since the run was saved: {'; '.join(changed)}", stacklevel=2
        )


def resumed_settings(folder: str | Path, given: dict[str, Any]) -> dict[str, Any]:
    """The saved run's settings with ``given`` options applied; an option that differs from the saved
    one is an error unless it is in :data:`RESUME_MAY_CHANGE`."""
    path = Path(folder) / STATE_FILE
    if not path.exists():
        raise FileNotFoundError(f"--resume: no {STATE_FILE} in {folder}; nothing to resume")
    settings = dict(json.loads(path.read_text())["settings"])
    conflicts = [
        f"{key} (saved {settings.get(key)!r}, given {value!r})"
        for key, value in given.items()
        if key not in RESUME_MAY_CHANGE and key in settings and settings[key] != value
    ]
    if conflicts:
        raise ValueError(
            f"--resume: options differ from the saved run: {'; '.join(conflicts)}. Only these may "
            f"change on resume: {', '.join(sorted(RESUME_MAY_CHANGE))}"
        )
    return {**settings, **given, "resume": True}


@contextmanager
def running(args: Any, pm: RlsdkPluginManager | None = None) -> Iterator[tuple[Runtime, dict[str, Resolved]]]:
    """Resolve the run's plugins, then start the engine; close everything on the way out."""
    pm = pm or get_plugin_manager()
    plugins = resolve_run_plugins(args, pm)
    with ExitStack() as stack:
        if args.ray_address:  # engines, trainer and grading as Ray actors and tasks
            from ..ray import on_ray

            plugins = stack.enter_context(on_ray(args, pm, plugins))
        runtime = open_runtime(args, pm, plugins["engine"])
        try:
            with tuned_garbage_collector():
                yield runtime, plugins
        finally:
            close_runtime(runtime)


def run_job(
    args: Any,
    pm: RlsdkPluginManager | None = None,
    *,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    on_eval: Callable[[int, dict[str, Any]], None] | None = None,
    progress: Callable[[int], None] | None = None,
    on_status: Callable[[str], None] | None = None,
) -> RunOutput:
    """Run ``args.num_rollout`` steps (continuing a saved run with ``args.resume``). ``on_status`` hears
    what the run is doing: setting up, then ``step N`` as step N (the ``rollout_id``) starts."""
    from ..data import DataSource

    status = on_status or (lambda text: None)
    check_data(args)  # an empty or unreadable dataset fails before the engine starts
    output = RunOutput(args.output_dir)
    if not args.resume:
        output.start_fresh(args.overwrite)  # so does an output folder holding another run
    loading = " (loading the model)" if args.engine == "embedded" else ""
    status(f"starting the {args.engine} engine{loading}")
    with running(args, pm) as (runtime, plugins), ExitStack() as closing:
        status("reading the data")
        runtime.progress = progress
        output.on_saved = runtime.state.setdefault(STATE_SAVED, [])
        data_source = DataSource(
            args,
            pm=runtime.pm,
            tokenizer=runtime.tokenizer,
            keep_messages=plugins["generate_rollout"].record.chat_messages,
        )
        check_images(runtime, data_source)
        if args.train:
            status("loading the trainer")
        training = open_training(args, runtime, plugins, output.folder) if args.train else None
        if training is not None:
            closing.callback(training.close)  # before the engine closes
        report = RunReport(output.folder, args.report_to) if args.train else None
        first = 0
        if args.resume:
            state = output.load_state()
            data_source.load_state_dict(state["data"])
            first = state["next_rollout_id"]
            warn_changed_plugins(state.get("plugins", {}), runtime.pm)
            if training is not None and state.get("checkpoint"):
                training.restore(Path(state["checkpoint"]))
        else:
            if training is not None and args.eval_interval and not args.skip_eval_before_train:
                status("eval before the first step")
                output.write_eval(-1, run_eval(args, runtime, plugins, -1))
            output.save_state(output.run_state(0, data_source.state_dict(), args, runtime.pm))
        for rollout_id in range(first, args.num_rollout):
            status(f"step {rollout_id}")
            # generate_rollout: one whole step
            result = call_generate_rollout(
                runtime, plugins["generate_rollout"], args, rollout_id, data_source
            )
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
                evaluated = run_eval(args, runtime, plugins, rollout_id)
                output.write_eval(rollout_id, evaluated)
                result.metrics.update(evaluated.metrics)
                if on_eval is not None:
                    on_eval(rollout_id, evaluated.metrics)
            if training is not None and training.checkpoint_due(rollout_id):
                # A training run resumes from its last checkpoint: state.json moves only with one.
                state["checkpoint"] = str(training.save(rollout_id, state))
                output.save_state(state)
            if report is not None:
                report.add(rollout_id, result.metrics)
        if report is not None:
            report.close()
    return output


def open_training(args: Any, runtime: Runtime, plugins: dict[str, Resolved], folder: Path) -> Any:
    """The trainer, built from ``--hf-checkpoint`` (the embedded engine's model folder by default)."""
    from ..training.session import TrainingSession

    return TrainingSession(args, runtime, plugins["trainer"], folder)


def check_step(args: Any, rollout_id: int, metrics: dict[str, Any]) -> None:
    """A step whose every sample failed, or was dropped for an invalid reward, stops the run with the causes
    (``on_failed_step=fail``), after the step's samples and the run's state are written."""
    if args.on_failed_step != "fail" or metrics.get("ledger/kept") or metrics.get("ledger/returned"):
        return
    entered = metrics.get("ledger/entered")
    failed = metrics.get("ledger/failed", 0)
    invalid = metrics.get("rollout/dynamic_filter/drop_invalid_reward", 0)
    if failed and failed == entered:
        requeued = metrics.get("ledger/requeued", 0)
        kept_data = (
            f"; their prompts are not used up ({requeued} samples back in the data, served again on --resume)"
            if requeued
            else ""
        )
        raise RlsdkError(
            f"step {rollout_id}: all {failed} samples failed ({shown_causes(metrics, 'rollout/failures')}); "
            f"the samples are in discarded.jsonl{kept_data} (--on-failed-step continue goes on)"
        )
    if invalid and invalid + failed == entered:
        raise RlsdkError(
            f"step {rollout_id}: all {entered} samples were dropped for an invalid reward "
            f"({shown_causes(metrics, 'rollout/invalid_reward_causes')}); the samples are in discarded.jsonl "
            "(--on-failed-step continue goes on, --on-invalid-reward score scores them instead)"
        )


def shown_causes(metrics: dict[str, Any], key: str) -> str:
    """The first :data:`SHOWN_CAUSES` distinct causes of ``metrics[key]``; the rest are in discarded.jsonl."""
    causes = list(dict.fromkeys(metrics.get(key, [])))
    shown = "; ".join(causes[:SHOWN_CAUSES]) or "unknown"
    if len(causes) > SHOWN_CAUSES:
        shown += f"; {len(causes) - SHOWN_CAUSES} more in discarded.jsonl"
    return shown


def check_data(args: Any) -> None:
    """Read the training data's rows once, without a tokenizer: bad rows and empty files fail early."""
    from ..data import BadRowPolicy, DataPath, read_rows
    from ..errors import DataError

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
        import warnings

        key = next(key for key in LABEL_KEYS if key in rows[0].values)
        warnings.warn(
            f"{data_path} has a {key!r} key but no --label-key is set: rewards see no label "
            f"(--label-key {key} gives it to them)",
            stacklevel=2,
        )


def check_images(runtime: Runtime, data_source: Any) -> None:
    """Prompts with images need a model with image understanding: say so before generating."""
    if not data_source.has_images:
        return
    info = runtime.run(runtime.engine.model_info())
    if not info.get("has_image_understanding"):
        from ..errors import DataError

        raise DataError(
            f"{data_source.data_path} has prompts with images, but the engine's model "
            f"{info.get('model_path')!r} cannot take images (no image understanding): "
            f"use a vision-language model"
        )


def run_eval(
    args: Any, runtime: Runtime, plugins: dict[str, Resolved], rollout_id: int
) -> RolloutFnEvalOutput:
    """generate_rollout with ``evaluation=True`` (the eval function, else the rollout function); its time
    in ``eval/seconds``."""
    resolved = plugins.get("eval", plugins["generate_rollout"])
    started = time.perf_counter()
    output = call_eval_rollout(runtime, resolved, args, rollout_id)
    output.metrics["eval/seconds"] = time.perf_counter() - started
    return output
