"""The output folder of a run and its resume rules: the files a run writes, the state ``--resume``
continues from, and which settings a resumed run may change."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import RolloutConfig
from ..errors import RlsdkError
from ..outputs import (
    DISCARDED_FILE,
    EVAL_FILE,
    EVAL_SAMPLES_FILE,
    METRICS_FILE,
    ROLLOUTS_FILE,
    STATE_FILE,
)
from ..plugins.manager import RlsdkPluginManager
from ..state_files import read_json
from ..types import RolloutFnEvalOutput, RolloutFnTrainOutput, Sample


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

    FILES = (ROLLOUTS_FILE, DISCARDED_FILE, METRICS_FILE, EVAL_FILE, EVAL_SAMPLES_FILE)

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        if self.folder.exists() and not self.folder.is_dir():
            raise RlsdkError(
                f"--output {str(self.folder)!r} is a file, not a folder: name a folder for the run"
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        self.on_saved: list[Callable[[dict[str, Any]], None]] = []
        """Called with each state after it is saved (:attr:`rlsdk.Runtime.on_state_saved`)."""

    def load_state(self) -> dict[str, Any]:
        path = self.folder / STATE_FILE
        if not path.exists():
            raise FileNotFoundError(f"--resume: no {STATE_FILE} in {self.folder}; nothing to resume")
        state = read_json(path, "file_sizes", "data", "next_rollout_id")
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

    def file_sizes(self) -> dict[str, int]:
        return {
            name: (self.folder / name).stat().st_size if (self.folder / name).exists() else 0
            for name in self.FILES
        }

    def run_state(
        self,
        next_rollout_id: int,
        data_state: dict[str, Any],
        args: RolloutConfig,
        pm: RlsdkPluginManager,
        data_file: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """What ``--resume`` needs: the next step, the output files' sizes, the data position and buffer,
        the data file's fingerprint, the run's settings and the installed plugins' versions."""
        return {
            "next_rollout_id": next_rollout_id,
            "file_sizes": self.file_sizes(),
            "data": data_state,
            "data_file": data_file,
            "settings": saved_settings(args),
            "plugins": pm.plugin_versions(),
        }

    def set_checkpoint(self, state: dict[str, Any], folder: Path) -> None:
        """Record ``folder`` as the state's checkpoint, relative to the output folder when inside it (a
        moved or copied run folder resumes from its own checkpoint)."""
        folder = Path(folder).absolute()
        inside = folder.is_relative_to(self.folder.absolute())
        state["checkpoint"] = str(folder.relative_to(self.folder.absolute()) if inside else folder)

    def checkpoint_path(self, state: dict[str, Any]) -> Path:
        """The state's checkpoint folder (a relative one is in the output folder)."""
        return self.folder / state["checkpoint"]

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
        "save_interval",
        "keep_last_n",
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
        "weight_sync_timeout",
        "train_async",
        "max_policy_version_lag",
    }
)
"""Options a resumed run may set differently from the saved run; any other given option must match."""


def saved_settings(args: RolloutConfig) -> dict[str, Any]:
    settings = args.to_dict()
    for key in ("resume", "overwrite", "sglang_router_ip", "sglang_router_port"):
        settings.pop(key, None)
    return settings


def warn_changed_plugins(saved: dict[str, Any], pm: RlsdkPluginManager) -> None:
    """A resumed run whose plugins changed version since the run was saved may not continue it exactly."""
    now = pm.plugin_versions()
    changed = [
        f"{name} {saved.get(name)} -> {now.get(name)}"
        for name in sorted(set(saved) | set(now))
        if saved.get(name) != now.get(name)
    ]
    if changed:
        warnings.warn(
            f"--resume: plugins changed since the run was saved: {'; '.join(changed)}", stacklevel=2
        )


def resumed_settings(folder: str | Path, given: dict[str, Any]) -> dict[str, Any]:
    """The saved run's settings with ``given`` options applied; an option that differs from the saved
    one is an error unless it is in :data:`RESUME_MAY_CHANGE`."""
    path = Path(folder) / STATE_FILE
    if not path.exists():
        raise FileNotFoundError(f"--resume: no {STATE_FILE} in {folder}; nothing to resume")
    settings = dict(read_json(path, "settings")["settings"])
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
