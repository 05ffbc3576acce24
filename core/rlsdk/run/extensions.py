"""The run's job-level extension points: its data source, its logging backends after each step and eval,
and the callbacks after each checkpoint, each called through its kind's call point."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from ..data import DataSource
from ..errors import PluginCallError
from ..plugins.calls import (
    call_checkpoint_callback,
    call_data_source,
    call_eval_rollout_log,
    call_rollout_log,
)
from ..runtime import Runtime
from ..types import RolloutFnEvalOutput, RolloutFnTrainOutput
from ..plugins.kinds import CheckpointCallback, DataSourceFactory, EvalRolloutLog, GenerateRollout, RolloutLog
from ..config import RolloutConfig, uses_core_data_source


def build_data_source(args: RolloutConfig, runtime: Runtime, rows: Any) -> Any:
    """The run's data source: rlsdk's own on ``prompt_data`` (the rows read already), or the data_source
    plugin's (data_source)."""
    plugins = runtime.plugins
    if uses_core_data_source(args):
        return DataSource(
            args,
            plugins=plugins,
            tokenizer=runtime.tokenizer,
            keep_messages=plugins.one(GenerateRollout).record.chat_messages,
            read=rows,
        )
    resolved = plugins.get(DataSourceFactory)
    assert resolved is not None
    source = call_data_source(resolved, args)
    if not callable(getattr(source, "state_dict", None)):
        warnings.warn(
            f"{resolved.describe()} has no state_dict()/load_state_dict(): --resume starts its data over",
            stacklevel=2,
        )
    return source


def source_state(data_source: Any) -> dict[str, Any]:
    return data_source.state_dict() if callable(getattr(data_source, "state_dict", None)) else {}


def load_data_state(data_source: Any, state: dict[str, Any]) -> None:
    if state and callable(getattr(data_source, "load_state_dict", None)):
        data_source.load_state_dict(state)


def log_step(args: RolloutConfig, runtime: Runtime, rollout_id: int, result: RolloutFnTrainOutput) -> None:
    """Every rollout_log backend, with slime's arguments (the kept samples flat, the step's metrics)."""
    samples = [s for group in result.samples for s in group]
    seconds = float(result.metrics.get("rollout/seconds") or 0.0)
    for resolved in runtime.plugins.each(RolloutLog):
        # rollout_log: abandoned at log_timeout, or at a stop signal
        call_rollout_log(resolved, rollout_id, args, samples, result.metrics, seconds, stop=runtime.stop)


def log_eval(args: RolloutConfig, runtime: Runtime, rollout_id: int, result: RolloutFnEvalOutput) -> None:
    """Every eval_rollout_log backend."""
    for resolved in runtime.plugins.each(EvalRolloutLog):
        # eval_rollout_log: abandoned at log_timeout, or at a stop signal
        call_eval_rollout_log(resolved, rollout_id, args, result.data, result.metrics, stop=runtime.stop)


def after_checkpoint(args: RolloutConfig, runtime: Runtime, rollout_id: int, folder: Path) -> None:
    """Every checkpoint_callback, once the checkpoint ``folder`` is complete and the state points at it; a
    failing callback stops the run, naming it (the checkpoint itself is kept)."""
    for resolved in runtime.plugins.each(CheckpointCallback):
        try:
            call_checkpoint_callback(resolved, args, rollout_id, folder)  # checkpoint_callback
        except PluginCallError as exc:
            raise PluginCallError(f"{exc} (the checkpoint {folder} is complete and kept)") from exc
