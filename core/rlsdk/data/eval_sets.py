"""Eval datasets, configured as slime configures them: ``--eval-config`` (slime's multi-task YAML: an optional
``eval:`` wrapper, ``defaults``, and ``datasets`` as a list of entries with a ``name`` or a mapping from name to
entry), ``eval_datasets`` entries (dicts, or slime's own ``EvalDatasetConfig`` objects) and
``--eval-prompt-data`` name/path pairs. Every setting of a dataset resolves the same way: the entry's own
value, else ``eval.defaults``', else the run's options (slime's precedence); an unset value (``None``) is no
value. An unknown key is an error listing the valid ones; a key slime parses but never uses is accepted
with a warning that says so.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ..errors import DataError, PluginError
from ..options import RunOptions
from ..plugins.run_plugins import RunPlugins
from ..types import Sample
from .rows import BadRowPolicy, DataPath, checked_rows

TEXT = (str,)
NUMBER = (int, float)
SETTINGS: dict[str, tuple[type, ...]] = {
    "rm_type": TEXT,
    "custom_rm_path": TEXT,
    "input_key": TEXT,
    "label_key": TEXT,
    "tool_key": TEXT,
    "metadata_key": TEXT,
    "multimodal_keys": (dict,),
    "apply_chat_template": (bool,),
    "apply_chat_template_kwargs": (dict,),
    "n_samples_per_eval_prompt": (int,),
    "temperature": NUMBER,
    "top_p": NUMBER,
    "top_k": (int,),
    "max_response_len": (int,),
    "stop": (list, str),
    "stop_token_ids": (list,),
    "min_new_tokens": (int,),
    "repetition_penalty": NUMBER,
    "skip_special_tokens": (bool,),
    "no_stop_trim": (bool,),
    "custom_generate_function_path": TEXT,
    "metadata_overrides": (dict,),
}
"""Each setting of slime's ``EvalDatasetConfig`` that slime's eval uses, and the types it takes."""

UNUSED_BY_SLIME: dict[str, tuple[type, ...]] = {
    "app_service": TEXT,
    "eval_task_timeout": NUMBER,
    "min_eval_samples": (int,),
    "eval_early_stop_remaining": (int,),
    "eval_early_stop_idle_timeout": NUMBER,
    "message_processor": (dict,),
    "reward_model": (dict,),
    "remote_environment": (dict,),
}
"""Settings slime's ``EvalDatasetConfig`` parses but nothing in slime reads (slime 624b824): accepted, ignored,
and warned about."""

RLSDK_SETTINGS: dict[str, tuple[type, ...]] = {
    "reward_key": TEXT,
    "eval_reward_key": TEXT,
    "eval_pass_key": TEXT,
    "eval_pass_threshold": NUMBER,
}
"""rlsdk's own per-dataset settings, taken in ``eval_datasets`` entries (not in ``--eval-config``, whose keys are
slime's): the key selecting the reward from dict rewards, and what decides a pass in pass@k."""

RLSDK_NAMES = {
    "eval_temperature": "temperature",
    "eval_top_p": "top_p",
    "eval_max_response_len": "max_response_len",
    "rollout_top_k": "top_k",
    "rollout_stop": "stop",
    "rollout_stop_token_ids": "stop_token_ids",
    "rollout_skip_special_tokens": "skip_special_tokens",
}
"""rlsdk's option names that ``eval_datasets`` entries took before slime's names; still taken there."""

RUN_OPTIONS: dict[str, tuple[str, ...]] = {
    "n_samples_per_eval_prompt": ("n_samples_per_eval_prompt", "n_samples_per_prompt"),
    "temperature": ("eval_temperature", "rollout_temperature"),
    "top_p": ("eval_top_p", "rollout_top_p"),
    "top_k": ("eval_top_k", "rollout_top_k"),
    "max_response_len": ("eval_max_response_len", "rollout_max_response_len"),
    "stop": ("rollout_stop",),
    "stop_token_ids": ("rollout_stop_token_ids",),
    "min_new_tokens": ("eval_min_new_tokens",),
    "skip_special_tokens": ("rollout_skip_special_tokens",),
    "input_key": ("eval_input_key", "input_key"),
    "label_key": ("eval_label_key", "label_key"),
    "tool_key": ("eval_tool_key", "tool_key"),
    "metadata_key": ("metadata_key",),
    "multimodal_keys": ("multimodal_keys",),
    "apply_chat_template": ("apply_chat_template",),
    "apply_chat_template_kwargs": ("apply_chat_template_kwargs",),
    "custom_rm_path": ("eval_custom_rm_path",),
    "reward_key": ("eval_reward_key", "reward_key"),
    "eval_pass_key": ("eval_pass_key",),
    "eval_pass_threshold": ("eval_pass_threshold",),
}
"""The settings a dataset takes from its entry, else the run: each with the run's options it falls back to,
first set one first (slime's ``eval_*`` arguments before the rollout's). A dataset without a
``custom_rm_path`` of its own leaves the run's ``custom_rm_path`` (and ``group_rm``) to the reward's usual
choice; one without ``rm_type`` leaves each row's ``metadata["rm_type"]`` and the run's ``rm_type``."""

DATA_OPTIONS = (
    "input_key",
    "label_key",
    "tool_key",
    "metadata_key",
    "multimodal_keys",
    "apply_chat_template",
    "apply_chat_template_kwargs",
)
"""The settings that say how the dataset's rows become prompts, under the run options of the same names."""


@dataclasses.dataclass(frozen=True)
class EvalDataset:
    """One eval dataset with every setting resolved (the entry's, else ``eval.defaults``', else the run's), by
    the names of slime's ``EvalDatasetConfig``. ``None``: not set anywhere (the engine's or the reward's own
    default applies)."""

    name: str
    path: str
    n_samples_per_eval_prompt: int
    input_key: str | None
    label_key: str | None
    tool_key: str | None
    metadata_key: str | None
    multimodal_keys: dict[str, str] | None
    apply_chat_template: bool | None
    apply_chat_template_kwargs: dict[str, Any] | None
    rm_type: str | None
    """Written into each sample's ``metadata["rm_type"]`` (over the row's own), as slime does."""
    custom_rm_path: str | None
    """The sample's ``custom_rm_path``: it comes first in the reward's choice."""
    reward_key: str | None
    eval_pass_key: str | None
    """What decides a pass in pass@k: a rubric part or a dict reward's key (None: the reward)."""
    eval_pass_threshold: float | None
    """The value a pass reaches (None: the maximum of what decides)."""
    custom_generate_function_path: str | None
    """The sample's ``generate_function_path``: the generator for this dataset's samples."""
    metadata_overrides: dict[str, Any]
    """Written into each sample's metadata last (after ``rm_type``)."""
    temperature: float | None
    top_p: float | None
    top_k: int | None
    max_response_len: int | None
    stop: list[str] | str | None
    stop_token_ids: list[int] | None
    min_new_tokens: int | None
    repetition_penalty: float | None
    skip_special_tokens: bool | None
    no_stop_trim: bool

    def data_options(self) -> dict[str, Any]:
        """The run options the data source reads, as this dataset sets them (unset ones left out)."""
        return {name: getattr(self, name) for name in DATA_OPTIONS if getattr(self, name) is not None}

    def sampling_params(self) -> dict[str, Any]:
        """SGLang sampling parameters for this dataset's samples; an unset one is left to the engine's
        default, as slime leaves it."""
        params: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_new_tokens": self.max_response_len,
            "stop": _as_list(self.stop) if self.stop else None,
            "stop_token_ids": list(self.stop_token_ids) if self.stop_token_ids else None,
            "min_new_tokens": self.min_new_tokens,
            "repetition_penalty": self.repetition_penalty,
            "skip_special_tokens": self.skip_special_tokens,
            "no_stop_trim": self.no_stop_trim,
            "spaces_between_special_tokens": False,
        }
        return {key: value for key, value in params.items() if value is not None}

    def stamp(self, sample: Sample) -> None:
        """Give a fresh sample this dataset's reward, generator and metadata settings."""
        if self.rm_type is not None:
            sample.metadata["rm_type"] = self.rm_type
        sample.metadata.update(self.metadata_overrides)
        if self.custom_rm_path is not None:
            sample.custom_rm_path = self.custom_rm_path
        if self.custom_generate_function_path is not None:
            sample.generate_function_path = self.custom_generate_function_path


# ----- reading ---------------------------------------------------------------------------------------------


def read_eval_config(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``eval.defaults`` and the dataset entries of an ``--eval-config`` file (YAML or JSON), in slime's
    layout: a mapping at the root, optionally under ``eval:``; ``datasets`` a list of entries with a ``name``
    or a mapping from name to entry. With OmegaConf installed the file is read by it, interpolations
    (``${...}``) resolved, as slime reads it."""
    path = Path(path)
    where = f"--eval-config {path}"
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{where}: {exc.strerror or exc}") from None
    root = _load(text, where)
    if not isinstance(root, dict):
        raise ValueError(f"{where} must contain a mapping at the root.")
    config = root.get("eval", root)
    if not isinstance(config, dict):
        raise ValueError(f"{where} must define an `eval` mapping or be a mapping itself.")
    defaults = config.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ValueError(f"{where}: eval.defaults must be a mapping, got {type(defaults).__name__}")
    try:
        entries = dataset_entries(config.get("datasets"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    if not entries:
        raise ValueError(f"{where} does not define any datasets under `eval.datasets`.")
    return dict(defaults), entries


def _load(text: str, where: str) -> Any:
    try:
        omegaconf = importlib.import_module("omegaconf")  # slime's reader: interpolations resolved
    except ImportError:
        try:
            values = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{where} does not parse: {exc}") from None
        if "${" in text and _has_interpolation(values):
            raise ValueError(
                f"{where} uses OmegaConf interpolation (${{...}}), which slime resolves with OmegaConf: "
                "pip install omegaconf"
            )
        return values
    try:
        return omegaconf.OmegaConf.to_container(omegaconf.OmegaConf.create(text), resolve=True)
    except Exception as exc:  # noqa: BLE001 -- OmegaConf's errors have no common base
        raise ValueError(f"{where} does not parse: {exc}") from None


def _has_interpolation(value: Any) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, dict):
        return any(_has_interpolation(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_interpolation(v) for v in value)
    return False


def dataset_entries(datasets: Any) -> list[dict[str, Any]]:
    """``eval.datasets`` as a list of entries: a list (each entry naming itself) or a mapping from name to entry
    (an entry may be empty)."""
    if datasets is None:
        return []
    if isinstance(datasets, dict):
        named = []
        for name, entry in datasets.items():
            if entry is not None and not isinstance(entry, dict):
                raise TypeError(f"eval dataset {name!r} must be a mapping, got {type(entry).__name__}")
            named.append({"name": name, **(entry or {})})
        return named
    if isinstance(datasets, (list, tuple)):
        entries = []
        for entry in datasets:
            if entry is not None and not isinstance(entry, dict):
                raise TypeError(f"each eval dataset entry must be a mapping, got {type(entry).__name__}")
            if not entry or "name" not in entry:
                raise ValueError("Each evaluation dataset entry must include a `name` field.")
            entries.append(dict(entry))
        return entries
    raise TypeError("eval.datasets must be either a list or a mapping.")


# ----- resolving -------------------------------------------------------------------------------------------


def run_eval_datasets(args: RunOptions) -> list[EvalDataset]:
    """The run's eval datasets, resolved: ``args.eval_config``'s (which replace ``eval_prompt_data``, as in
    slime), ``args.eval_datasets`` and ``eval_prompt_data``'s ``name path`` pairs (a name already taken is
    skipped). Two datasets with one name are an error."""
    config = getattr(args, "eval_config", None)
    entries = [_entry_of(spec) for spec in getattr(args, "eval_datasets", None) or []]
    datasets = resolve_datasets(args, entries, {}, rlsdk_keys=True)
    if config:
        defaults, file_entries = read_eval_config(config)
        try:
            from_file = resolve_datasets(args, file_entries, defaults)
            check_unique(from_file)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"--eval-config {config}: {exc}") from None
        datasets += from_file
        if getattr(args, "eval_prompt_data", None):
            warnings.warn(
                "--eval-config replaces --eval-prompt-data, as in slime: its pairs are not evaluated"
            )
    else:
        flat = list(getattr(args, "eval_prompt_data", None) or [])
        if len(flat) % 2:
            raise ValueError(f"eval_prompt_data takes name/path pairs, got {flat!r}")
        taken = {d.name for d in datasets}
        pairs = [{"name": n, "path": p} for n, p in zip(flat[::2], flat[1::2], strict=True) if n not in taken]
        datasets += resolve_datasets(args, pairs, {})
    check_unique(datasets)
    return datasets


def check_unique(datasets: list[EvalDataset]) -> None:
    names = [d.name for d in datasets]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"eval datasets {twice} are given twice: each needs a name of its own")


def check_eval_datasets(args: RunOptions, plugins: RunPlugins) -> list[EvalDataset]:
    """The run's eval datasets, checked before any model loads: each one's file exists, and its reward and
    generator resolve (an ``rm_type`` no plugin provides fails here, not as invalid rewards mid-run)."""
    datasets = run_eval_datasets(args)
    for dataset in datasets:
        try:  # read once: a missing or empty file, or no row with the input key, fails here
            checked_rows(
                DataPath.parse(dataset.path),
                BadRowPolicy(getattr(args, "on_bad_row", "error")),
                dataset.input_key or args.input_key,
                "the eval dataset's input_key or --input-key",
            )
        except DataError as exc:
            raise DataError(f"eval dataset {dataset.name!r}: {exc}") from None
        try:
            if dataset.custom_rm_path or dataset.rm_type:
                plugins.resolve("reward", dataset.custom_rm_path or dataset.rm_type or "")
            if dataset.custom_generate_function_path:
                plugins.resolve("custom_generate", dataset.custom_generate_function_path)
        except PluginError as exc:
            raise PluginError(f"eval dataset {dataset.name!r}: {exc}") from None
    return datasets


def _entry_of(spec: Any) -> dict[str, Any]:
    """An ``eval_datasets`` entry as a dict: a dict as it is, slime's ``EvalDatasetConfig`` by its set fields."""
    if isinstance(spec, dict):
        return dict(spec)
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        values = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
        return {k: v for k, v in values.items() if v is not None and v != {}}
    raise ValueError(f"an eval dataset is a dict or slime's EvalDatasetConfig, got {type(spec).__name__}")


def resolve_datasets(
    args: RunOptions, entries: list[dict[str, Any]], defaults: Mapping[str, Any], *, rlsdk_keys: bool = False
) -> list[EvalDataset]:
    """Each entry resolved setting by setting: the entry, then ``defaults``, then ``args``. ``rlsdk_keys``
    also takes rlsdk's own keys (:data:`RLSDK_SETTINGS`, :data:`RLSDK_NAMES`), as ``eval_datasets`` does."""
    valid = {**SETTINGS, **UNUSED_BY_SLIME, **(RLSDK_SETTINGS if rlsdk_keys else {})}
    unknown = sorted(set(defaults) - set(valid))
    if unknown:
        raise ValueError(f"Unknown key(s) in eval.defaults: {unknown}. Valid keys: {sorted(valid)}.")
    checked_defaults = _checked("eval.defaults", dict(defaults), valid)
    datasets = []
    for raw in entries:
        entry = {RLSDK_NAMES.get(k, k) if rlsdk_keys else k: v for k, v in raw.items()}
        name = entry.pop("name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"an eval dataset needs a name, got {raw!r}")
        path = entry.pop("path", None)
        if not isinstance(path, str) or not path:
            raise ValueError(f"eval dataset {name!r} needs a path (the JSONL or Parquet file), got {path!r}")
        unknown = sorted(set(entry) - set(valid))
        if unknown:
            close = difflib.get_close_matches(unknown[0], valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"eval dataset {name!r}: unknown key(s) {unknown}{hint}. Valid keys: {sorted(['name', 'path', *valid])}."
            )
        settings = {**checked_defaults, **_checked(f"eval dataset {name!r}", entry, valid)}
        ignored = sorted(k for k in settings if k in UNUSED_BY_SLIME)
        if ignored:
            warnings.warn(
                f"eval dataset {name!r}: {ignored} are ignored: slime parses these EvalDatasetConfig fields "
                "but never uses them, and neither does rlsdk",
                stacklevel=2,
            )
        datasets.append(_resolved(args, name, path, settings))
    return datasets


def _checked(where: str, values: dict[str, Any], valid: dict[str, tuple[type, ...]]) -> dict[str, Any]:
    """``values`` without unset ones, each of its setting's type (an int is a number, a bool is not)."""
    checked: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        kinds = valid[key]
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise ValueError(f"{where}: {key} must be {names}, got {value!r:.100}")
        checked[key] = value
    for key in ("n_samples_per_eval_prompt", "min_eval_samples"):
        if key in checked and checked[key] < 1:
            raise ValueError(f"{where}: {key} must be positive, got {checked[key]}")
    for key in ("max_response_len", "min_new_tokens"):
        if key in checked and checked[key] < 0:
            raise ValueError(f"{where}: {key} must be 0 or more, got {checked[key]}")
    if "stop" in checked and not all(isinstance(s, str) for s in _as_list(checked["stop"])):
        raise ValueError(f"{where}: stop must be a list of strings, got {checked['stop']!r:.100}")
    if "stop_token_ids" in checked and not all(
        isinstance(i, int) and not isinstance(i, bool) for i in checked["stop_token_ids"]
    ):
        raise ValueError(
            f"{where}: stop_token_ids must be a list of integers, got {checked['stop_token_ids']!r}"
        )
    return checked


def _as_list(value: Any) -> list[Any]:
    return [value] if isinstance(value, str) else list(value)


def _resolved(args: RunOptions, name: str, path: str, settings: dict[str, Any]) -> EvalDataset:
    def pick(key: str) -> Any:
        if key in settings:
            return settings[key]
        for option in RUN_OPTIONS.get(key, ()):
            value = getattr(args, option, None)
            if value is not None:
                return value
        return None

    picked = {key: pick(key) for key in RUN_OPTIONS}
    reward_key = settings.get("eval_reward_key", settings.get("reward_key"))
    return EvalDataset(
        name=name,
        path=path,
        **{
            **picked,
            "n_samples_per_eval_prompt": picked["n_samples_per_eval_prompt"] or 1,
            "reward_key": reward_key if reward_key is not None else picked["reward_key"],
        },
        rm_type=settings.get("rm_type"),
        custom_generate_function_path=settings.get("custom_generate_function_path"),
        metadata_overrides=dict(settings.get("metadata_overrides") or {}),
        repetition_penalty=settings.get("repetition_penalty"),
        no_stop_trim=settings.get("no_stop_trim", True),
    )
