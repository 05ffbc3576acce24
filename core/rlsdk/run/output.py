"""The output folder of a run and its resume rules: the files a run writes, the state ``--resume``
continues from (read as untrusted input: every name and path it holds is checked before use), and which
settings a resumed run may change."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..config import RolloutConfig
from ..errors import CheckpointError, RlsdkError
from ..options import EVAL_SET_SETTINGS
from ..outputs import (
    DISCARDED_FILE,
    EVAL_FILE,
    EVAL_SAMPLES_FILE,
    METRICS_FILE,
    ROLLOUTS_FILE,
    STATE_FILE,
    TIMINGS_FILE,
    is_timing,
)
from ..plugins.manager import RlsdkPluginManager
from ..state_files import check_fingerprints, folder_fingerprints, read_json, signed, signed_here, strings_in
from ..types import RolloutFnEvalOutput, RolloutFnTrainOutput, Sample
from .loggers import LOG_FILES


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

    The state records each file's size after the step it covers (the JSON-lines loggers' files under
    ``logs/`` too); resuming truncates what a crash wrote past it, so no step is written twice. ``save`` is
    the run's checkpoint folder when it is not inside this one."""

    FILES = (
        ROLLOUTS_FILE,
        DISCARDED_FILE,
        METRICS_FILE,
        EVAL_FILE,
        EVAL_SAMPLES_FILE,
        TIMINGS_FILE,
        *LOG_FILES,
    )

    def __init__(self, folder: str | Path, save: str | Path | None = None) -> None:
        self.folder = Path(folder)
        self.save = Path(save) if save else None
        if self.folder.exists() and not self.folder.is_dir():
            raise RlsdkError(
                f"--output {str(self.folder)!r} is a file, not a folder: name a folder for the run"
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        self.inputs: dict[str, Any] = {}
        """Fingerprints of the run's inputs saved with each state (``data_file``, ``base_model``), checked on
        ``--resume``."""
        self.on_saved: list[Callable[[dict[str, Any]], None]] = []
        """Called with each state after it is saved (:attr:`rlsdk.Runtime.on_state_saved`)."""
        self.findings: list[dict[str, str]] = []
        """What the run's silent-failure detectors found (:mod:`.detectors`); ``rlsdk run`` repeats them at
        its end."""
        self.timings_apart = False
        """Deterministic mode: wall-clock figures go to ``timings.jsonl``, not to ``metrics.jsonl`` and
        ``eval.jsonl``, which then hold only what the seeds decide."""

    def load_state(self) -> dict[str, Any]:
        """The saved state, checked before anything is done with it: ``file_sizes`` names only the run's
        own files (regular files inside the folder, no links), each at least as long as recorded, and
        each is cut back to its recorded size; the checkpoint it names lies inside the run's folders."""
        path = self.folder / STATE_FILE
        if not path.exists():
            raise FileNotFoundError(f"--resume: no {STATE_FILE} in {self.folder}; nothing to resume")
        state = read_json(path, "file_sizes", "data", "next_rollout_id")
        sizes = state["file_sizes"]
        if not isinstance(sizes, dict) or not isinstance(state["next_rollout_id"], int):
            raise CheckpointError(f"{path} is damaged: file_sizes is not an object of sizes")
        cut = []
        for name, size in sizes.items():
            if name not in self.FILES:
                raise CheckpointError(
                    f"{path}: file_sizes names {name[:200]!r}, not one of the run's files "
                    f"({', '.join(self.FILES)}): the state was edited or is damaged; nothing was cut"
                )
            target = self.folder / name
            if not target.exists() and not target.is_symlink():
                continue
            if target.is_symlink() or not target.is_file() or target.parent.is_symlink():
                raise CheckpointError(
                    f"{target} is not a file of the run (a link, or not a file): nothing was cut"
                )
            if type(size) is not int or not 0 <= size <= target.stat().st_size:
                raise CheckpointError(
                    f"{path}: file_sizes gives {name} {size!r:.40} bytes, but it has {target.stat().st_size}: "
                    "the state does not belong to these files; nothing was cut"
                )
            cut.append((target, size))
        if state.get("checkpoint") is not None:
            self.checkpoint_path(state)  # inside the run's folders, or an error
        for target, size in cut:
            with open(target, "r+b") as f:
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
        self.append_metrics(METRICS_FILE, rollout_id, output.metrics)

    def append_metrics(self, name: str, rollout_id: int, metrics: dict[str, Any]) -> None:
        """A row of ``metrics`` to ``name``; with :attr:`timings_apart`, its wall-clock figures to
        ``timings.jsonl`` (with the file they belong to) instead."""
        if not self.timings_apart:
            self.append(name, [{"rollout_id": rollout_id, **metrics}])
            return
        timings = {key: value for key, value in metrics.items() if is_timing(key)}
        self.append(
            name, [{"rollout_id": rollout_id, **{k: v for k, v in metrics.items() if k not in timings}}]
        )
        self.append(TIMINGS_FILE, [{"file": name, "rollout_id": rollout_id, **timings}])

    def write_eval(self, rollout_id: int, output: RolloutFnEvalOutput) -> None:
        """The eval's metrics to ``eval.jsonl``, its samples (with their dataset) to
        ``eval_samples.jsonl``."""
        self.append_metrics(EVAL_FILE, rollout_id, output.metrics)
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
    ) -> dict[str, Any]:
        """What ``--resume`` needs: the next step, the output files' sizes, the data position and buffer,
        the fingerprints of the run's inputs (:attr:`inputs`), the run's settings and the installed plugins'
        versions."""
        return {
            "next_rollout_id": next_rollout_id,
            "file_sizes": self.file_sizes(),
            "data": data_state,
            **self.inputs,
            "settings": saved_settings(args),
            "plugins": pm.plugin_versions(),
        }

    def set_checkpoint(self, state: dict[str, Any], folder: Path) -> None:
        """Record ``folder`` as the state's checkpoint, relative to the output folder when inside it (a
        moved or copied run folder resumes from its own checkpoint), with its files' fingerprints."""
        folder = Path(folder).absolute()
        inside = folder.is_relative_to(self.folder.absolute())
        state["checkpoint"] = str(folder.relative_to(self.folder.absolute()) if inside else folder)
        state["checkpoint_files"] = folder_fingerprints(folder)

    def checkpoint_path(self, state: dict[str, Any]) -> Path:
        """The state's checkpoint folder (a relative one is in the output folder), which must lie inside
        the output folder or the run's ``save`` folder (links resolved): :class:`CheckpointError` otherwise."""
        named = state["checkpoint"]
        if not isinstance(named, str) or not named or "\0" in named:
            raise CheckpointError(f"{self.folder / STATE_FILE} is damaged: checkpoint {named!r:.80}")
        path = self.folder / named
        roots = [self.folder, *([self.save] if self.save else [])]
        if not any(path.resolve().is_relative_to(root.resolve()) for root in roots):
            raise CheckpointError(
                f"{self.folder / STATE_FILE} names the checkpoint {named[:200]!r}, outside the run's folders "
                f"({', '.join(map(str, roots))}; --save names the checkpoint folder): nothing is loaded from it"
            )
        return path

    def check_checkpoint(self, state: dict[str, Any]) -> Path:
        """The state's checkpoint folder, each of its files as it was saved (SHA-256); a checkpoint saved
        without fingerprints (by an older rlsdk) is loaded as it is, with a warning."""
        path = self.checkpoint_path(state)
        files = state.get("checkpoint_files")
        if files is None:
            warnings.warn(
                f"--resume: {path} was saved without fingerprints (an older rlsdk): its files are loaded "
                "unchecked (formats that hold no code only)",
                stacklevel=2,
            )
        else:
            check_fingerprints(path, files, "--resume")
        return path

    def save_state(self, state: dict[str, Any]) -> None:
        """Write ``state.json`` atomically, signed with this machine's key (:func:`rlsdk.state_files.signed`)."""
        tmp = self.folder / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(signed(state)))
        os.replace(tmp, self.folder / STATE_FILE)
        for callback in self.on_saved:
            callback(state)


RESUME_MAY_CHANGE = frozenset(
    {
        "num_rollout",
        "resume",
        "output_dir",
        "eval_interval",
        *EVAL_SET_SETTINGS,
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
        "log_timeout",
        "constant_reward_steps",
        "grader_workers",
        "grader_timeout",
        "rollout_buffer_url",
        "rollout_buffer_wait",
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
        "ray_call_timeout",
        "ray_trainer_timeout",
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
    settings = read_json(path, "settings")["settings"]
    if not isinstance(settings, dict):
        raise CheckpointError(f"{path} is damaged: its settings are not an object")
    saved_extra = settings.get("extra")
    extra: dict[str, Any] = saved_extra if isinstance(saved_extra, dict) else {}
    saved = {**extra, **settings}  # the plugins' options are saved under extra
    conflicts = [
        f"{key} (saved {saved[key]!r}, given {value!r})"
        for key, value in given.items()
        if key not in RESUME_MAY_CHANGE and key in saved and saved[key] != value
    ]
    if conflicts:
        raise ValueError(
            f"--resume: options differ from the saved run: {'; '.join(conflicts)}. Only these may "
            f"change on resume: {', '.join(sorted(RESUME_MAY_CHANGE))}"
        )
    extra = {**extra, **{key: value for key, value in given.items() if key in extra}}  # given ones win
    return {**settings, **given, "extra": extra, "resume": True}


NOT_SIGNED_HERE = (
    "{path} was not written by rlsdk on this machine (another machine's, or edited since): a run folder "
    "is not trusted to name code"
)


def untrusted_texts(folder: str | Path, state: dict[str, Any], skip: Iterable[str] = ()) -> dict[str, str]:
    """Every text of a saved ``state`` (but the settings named in ``skip``) mapped to why code it names is
    not loaded (for :func:`rlsdk.plugins.loading.refusing_code`); nothing when this machine signed it."""
    if signed_here(state):
        return {}
    path = Path(folder) / STATE_FILE
    why = NOT_SIGNED_HERE.format(path=path)
    settings = state.get("settings")
    skip = set(skip)
    texts: dict[str, str] = {}
    if isinstance(settings, dict):
        for key, value in settings.items():
            if key in skip:
                continue
            for text in strings_in(value):
                texts.setdefault(
                    text,
                    f"the setting {key} in it names it, and {why}: name it on the command line again "
                    f"(--{key.replace('_', '-')} or --set {key}=...), or resume with --trust-folder if you trust the folder",
                )
    rest = {k: v for k, v in state.items() if k != "settings"}
    for text in strings_in(rest):
        texts.setdefault(
            text,
            f"the saved data in it names it, and {why}: resume with --trust-folder if you trust the folder",
        )
    return texts


def resume_refusals(folder: str | Path, given: dict[str, Any]) -> dict[str, str]:
    """:func:`untrusted_texts` of the state in ``folder`` for a resume that gives ``given`` options."""
    path = Path(folder) / STATE_FILE
    if not path.exists():
        return {}
    return untrusted_texts(folder, read_json(path, "settings"), skip=given)
