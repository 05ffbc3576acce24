"""The run configuration handed to every plugin as ``args``; attribute names follow slime's arguments."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import functools
import json
import math
import types
import typing
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any


from ..engines.launch.arguments import check_passthrough
from ..errors import PluginError
from ..plugins.calls import call_environment
from ..plugins.kinds import RECORD_TYPES
from ..plugins.manager import RlsdkPluginManager, get_plugin_manager
from ..plugins.records import Option, PluginInfo, Resolved
from ..plugins.verifiers_envs import is_verifiers_module, verifiers_environment
from ..slime_args import SLIME_ARG_DEFAULTS, SLIME_FIXED_CHOICES
from ..options import SECTIONS, RunOptions
from ..training_options import option_docs

DEFAULT_ENVIRONMENT = "arithmetic"
"""The environment ``rlsdk run`` takes without ``prompt_data`` or ``env``: single-digit arithmetic, shipped in core."""
DATASETS = Path(__file__).parent.parent / "datasets"
"""The datasets that ship inside core (the arithmetic environment's among them)."""


_option_reads: set[str] | None = None
"""The plugin options read while :func:`recording_option_reads` is active (None: not recording)."""


@contextlib.contextmanager
def recording_option_reads() -> Iterator[set[str]]:
    """The plugins' options (``extra`` or their declared defaults) read as attributes of any configuration in
    this process, by any thread, while inside: a run's record of the options its plugins used."""
    global _option_reads
    outer, _option_reads = _option_reads, set()
    try:
        yield _option_reads
    finally:
        if outer is not None:
            outer.update(_option_reads)
        _option_reads = outer


def shipped_datasets() -> dict[str, Path]:
    """The datasets that ship with rlsdk, by name (the file's stem): ``arithmetic-train``, ``arithmetic-eval``..."""
    return {path.stem: path for path in sorted(DATASETS.glob("*.jsonl"))}


ALIASES = {
    "rollout": "rollout_function_path",
    "eval_rollout": "eval_function_path",
    "custom_generate": "custom_generate_function_path",
    "rm": "rm_type",
    "async": "train_async",
    "dynamic_filter": "dynamic_sampling_filter_path",
    "over_sampling_filter": "over_sampling_filter_path",
    "buffer_filter": "buffer_filter_path",
    "data": "prompt_data",
    "seed": "rollout_seed",
    "max_new_tokens": "rollout_max_response_len",
    "temperature": "rollout_temperature",
    "top_p": "rollout_top_p",
    "top_k": "rollout_top_k",
    "deterministic": "sglang_enable_deterministic_inference",
    "output": "output_dir",
    "ray": "ray_address",
    "runtime_env": "ray_runtime_env",
    "sample_hook": "rollout_sample_hook_path",
    "data_source": "data_source_path",
    "rollout_log": "custom_rollout_log_function_path",
    "eval_rollout_log": "custom_eval_rollout_log_function_path",
    "advantage": "custom_advantage_function_path",
    "update_weight_transport": "weight_sync",
}
"""Short names of options (``--rm``, ``rm:`` in a config file) beside slime's long ones."""


@dataclass(frozen=True, init=False)
class RolloutConfig(RunOptions):
    """A run's configuration: a plain frozen value, built once (:meth:`from_dict`, :meth:`from_file`, or by
    keyword) and never written; a change is a new value (:meth:`replace`). Its options come in sections
    (``config.sections.training.lr``: :mod:`rlsdk.options`), and every option reads under slime's flat name
    too (``args.lr``): the view slime's functions and rlsdk's plugins get as ``args``. What a run learns while
    it runs (the engine's address, the model's folder) is the runtime's (:func:`rlsdk.run.session.run_args`
    shows it to plugins under slime's names). The options that name each kind's plugin are declared by the
    kinds (:mod:`rlsdk.plugins.kinds`: ``rm_type``, ``custom_generate_function_path``, ...) and kept in
    ``choices``; plugins declare options of their own (``rlsdk_options``), kept in ``extra``. Both read as
    attributes (``args.rm_type``, ``args.retriever_url``), their default when unset."""

    def __init__(self, *, declared: dict[str, Option] | None = None, **values: Any) -> None:
        """Core options by keyword (the kinds' among them), and plugins' options (kept in ``extra``) checked
        against ``declared`` (default: what the installed plugins declare); an unknown key is a ValueError
        with a did-you-mean. ``extra`` itself is taken as given (it was checked when built)."""
        extra = dict(values.pop("extra", None) or {})
        choices = {option.name: option.default for option in kind_option_list()}
        choices.update(values.pop("choices", None) or {})
        choices.update({key: values.pop(key) for key in [k for k in values if k in choices]})
        fields = [f for f in dataclasses.fields(self) if f.name not in ("extra", "choices")]
        names = {f.name for f in fields}
        loose = {key: values.pop(key) for key in [k for k in values if k not in names]}
        if declared is None and loose:  # only then are the installed plugins loaded
            declared = installed_options()
        if loose:
            extra.update(plugin_values(loose, declared or {}))
        for f in fields:
            if f.name in values:
                value = values[f.name]
            else:
                value = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            object.__setattr__(self, f.name, value)
        if self.over_sampling_batch_size is None:
            object.__setattr__(self, "over_sampling_batch_size", self.rollout_batch_size)
        object.__setattr__(self, "choices", choices)
        for (
            name,
            value,
        ) in choices.items():  # read as plain attributes: the rollout loop reads some per sample
            object.__setattr__(self, name, value)
        object.__setattr__(self, "extra", extra)
        object.__setattr__(self, "_declared", declared)
        self.__post_init__()

    if not TYPE_CHECKING:  # mypy sees only the fields: core's reads of ``args`` are checked against them

        def __getattr__(self, name: str) -> Any:
            """A kind's option, a plugin option (set in ``extra``, else its declared default) or one of slime's
            arguments."""
            choices = self.__dict__.get("choices", {})
            if name in choices:
                return choices[name]
            extra = self.__dict__.get("extra", {})
            if name in extra:
                if _option_reads is not None:
                    _option_reads.add(name)
                return extra[name]
            if not name.startswith("_"):
                declared = self.__dict__.get("_declared")
                declared = installed_options() if declared is None else declared
                if name in declared:
                    if _option_reads is not None:
                        _option_reads.add(name)
                    return declared[name].default
                if name in SLIME_ARG_DEFAULTS:
                    return SLIME_ARG_DEFAULTS[name]
            raise AttributeError(f"{type(self).__name__} has no option {name!r}")

    def __post_init__(self) -> None:
        """Each section's own checks, then those across sections."""
        for section in SECTIONS.values():
            check = vars(section).get("__post_init__")
            if check is not None:
                check(self)
        check_numbers(self)
        for name, value in SLIME_FIXED_CHOICES.items():
            if self.extra.get(name, value) != value:
                raise ValueError(
                    f"{name} {self.extra[name]!r}: rlsdk's trainers take {value!r} only (AdamW, constant lr)"
                )
        if self.loss_type == "custom_loss" and not self.choices.get("custom_loss_function_path"):
            raise ValueError(
                "loss_type custom_loss needs custom_loss_function_path (a loss name or dotted path)"
            )
        if self.lora_rank and self.ray_address:
            raise ValueError(
                "lora_rank: LoRA runs do not run on Ray yet (its engine pool takes whole weights)"
            )
        if self.colocate and (self.train_async or self.max_policy_version_lag is not None):
            raise ValueError(
                "--async and --max-policy-version-lag generate while the trainer trains: they need the "
                "engines on GPUs of their own, not --colocate"
            )

    @classmethod
    def option_names(cls) -> list[str]:
        """Every core option: the kinds' and the fields'."""
        return list(core_options())

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, pm: Any = None) -> RolloutConfig:
        """Build from a mapping (a config file, ``--set``, the command line); dashes in keys become underscores.

        Every value is checked against its option: core's (this class's fields and the kinds' options), the
        options the plugins of ``pm`` declare (default: the installed ones; they land in ``extra``, with the
        defaults of the rest when ``pm`` is given) or slime's arguments. An unknown key or a value of the wrong type is a ValueError naming it, with a
        did-you-mean."""
        declared = declared_options(pm)
        given = canonical_keys({k: v for k, v in values.items() if k != "extra"})
        given.update(values.get("extra") or {})
        if given.get("env"):  # the environment's settings, under every option given
            given = {**environment_options(given["env"], pm, train=bool(given.get("train"))), **given}
        core = core_options()
        custom = custom_config(given.get("custom_config_path"), declared)
        given.update({key: value for key, value in custom.items() if key in core or key in declared})
        core_values = {key: core[key].check(value) for key, value in given.items() if key in core}
        extra = plugin_values({k: v for k, v in given.items() if k not in core}, declared)
        extra.update({key: value for key, value in custom.items() if key not in core and key not in declared})
        if pm is not None:  # the run's plugins: every option they declare, its default when not given
            extra = {**{name: option.default for name, option in declared.items()}, **extra}
        return cls(**core_values, extra=extra, declared=declared)

    @staticmethod
    def read_file(path: str | Path) -> dict[str, Any]:
        """The options of a YAML, TOML or JSON file."""
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"config file {path}: {exc.strerror or exc}") from None
        import tomllib

        import yaml  # imported here: at the top they cost every `import rlsdk` 10 ms

        try:
            if path.suffix == ".toml":
                values = tomllib.loads(text)
            elif path.suffix == ".json":
                values = json.loads(text)
            else:
                values = yaml.safe_load(text) or {}
        except (ValueError, yaml.YAMLError) as exc:  # TOML and JSON errors are ValueErrors
            raise ValueError(f"config file {path} does not parse: {exc}") from None
        if not isinstance(values, dict):
            raise ValueError(f"{path}: a config file must hold a mapping of options")
        return values

    @classmethod
    def from_file(cls, path: str | Path, *, pm: Any = None, **overrides: Any) -> RolloutConfig:
        """Build from a YAML, TOML or JSON file, then apply ``overrides`` (e.g. from the CLI)."""
        try:
            return cls.from_dict({**cls.read_file(path), **overrides}, pm=pm)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    def with_default_data(self, given: set[str] | frozenset[str] = frozenset()) -> RolloutConfig:
        """With neither ``prompt_data`` nor ``env`` nor a data source of a plugin's: this configuration on the
        shipped arithmetic environment (its training set, ``label`` key and chat template; with ``train`` also
        its disjoint eval set and demo training settings), for the options not in ``given``; else this
        configuration."""
        if (
            self.prompt_data is not None
            or self.choices.get("env") is not None
            or not uses_core_data_source(self)
        ):
            return self
        core = core_options()
        settings = environment_options(DEFAULT_ENVIRONMENT, None, train=self.train)
        changes = {name: core[name].check(value) for name, value in settings.items() if name not in given}
        if "over_sampling_batch_size" not in given:
            changes["over_sampling_batch_size"] = changes.get("rollout_batch_size", self.rollout_batch_size)
        return self.replace(env=DEFAULT_ENVIRONMENT, **changes)

    def replace(self, **changes: Any) -> RolloutConfig:
        """A copy with ``changes`` (any option: core's, the kinds', a plugin's), checked as when built."""
        values = {**self.to_dict(), **changes}
        extra = {**values.pop("extra"), **{k: values.pop(k) for k in [k for k in values if k in self.extra]}}
        return type(self)(**values, extra=extra, declared=self.__dict__.get("_declared"))

    def to_dict(self) -> dict[str, Any]:
        """Every core option by name (the kinds' among them) and ``extra``."""
        values = {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self)}
        return {**values.pop("choices"), **values}


CORE_DATA_SOURCE = "prompt_data"
"""Core's data source: the groups of ``prompt_data``'s rows."""


def uses_core_data_source(args: RunOptions) -> bool:
    """Whether the run's groups come from core's data source (``prompt_data``), not a plugin's."""
    return getattr(args, "data_source_path", None) in (None, CORE_DATA_SOURCE)


def demo_settings(train: bool) -> dict[str, Any]:
    """What ``rlsdk run`` sets with neither ``--data`` nor ``--env``: the shipped arithmetic environment
    (:data:`DEFAULT_ENVIRONMENT`) and its options (with ``train`` also its training settings). With ``--data``
    none of these apply: the options keep their defaults."""
    return {"env": DEFAULT_ENVIRONMENT, **environment_options(DEFAULT_ENVIRONMENT, None, train=train)}


def custom_config(path: str | None, declared: dict[str, Option]) -> dict[str, Any]:
    """slime's ``--custom-config-path``: a YAML file of values set on ``args`` over every other setting (slime's
    order), for custom functions that read them (``args.tis_level`` of slime's mismatch helper). A key that
    names an option is checked as that option; any other is kept as it is, as slime keeps it."""
    if not path:
        return {}
    values = canonical_keys(RolloutConfig.read_file(path))
    known = {*core_options(), *declared, *slime_argument_names()}
    loose = [key for key in values if key not in known]
    if loose:
        warnings.warn(
            f"custom_config_path {path}: {loose} are no options; set on args for the functions that read them"
        )
    return values


def kind_option_list() -> list[Option]:
    """The options of every kind (:attr:`rlsdk.plugins.records.PluginRecord.options`), in kind order."""
    return [option for record in RECORD_TYPES.values() for option in record.options]


def plugin_values(values: dict[str, Any], declared: dict[str, Option]) -> dict[str, Any]:
    """``values`` of plugins' options (checked), slime's arguments, SGLang's server and router arguments
    (``sglang_NAME``, ``router_NAME``, passed on as in slime); anything else is a ValueError naming the
    closest known option."""
    checked = {}
    for key, value in values.items():
        if key in declared:
            checked[key] = declared[key].check(value)
        elif key in slime_argument_names():
            checked[key] = value
        elif key.startswith(("sglang_", "router_")):  # a launched server's or router's --NAME
            check_passthrough(key, RolloutConfig.option_names())
            checked[key] = value
        else:
            known = [*RolloutConfig.option_names(), *declared, *slime_argument_names()]
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else " (see `rlsdk run --help`)"
            raise ValueError(f"unknown option {key!r}{hint}")
    return checked


@functools.cache
def core_options() -> dict[str, Option]:
    """Core's options, one per field of :class:`RolloutConfig` (its training options included), with the
    field's type, default and docstring: the single source of ``rlsdk run``'s options and their checks."""
    docs = {name: doc for section in SECTIONS.values() for name, doc in option_docs(section).items()}
    hints = typing.get_type_hints(RolloutConfig)
    options = {option.name: option for option in kind_option_list()}
    for f in dataclasses.fields(RolloutConfig):
        if f.name in ("extra", "choices"):
            continue
        kind = hints[f.name]
        if isinstance(kind, types.UnionType):  # X | None
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        base = typing.get_origin(kind) or kind
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        options[f.name] = Option(name=f.name, type=base, default=default, help=docs.get(f.name, ""))
    return options


@functools.cache
def installed_plugin_manager() -> RlsdkPluginManager:
    """The installed plugins, loaded once per process, quietly (a plugin that fails to load is reported by the
    run's own manager)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_plugin_manager()


@functools.cache
def installed_plugin_options() -> dict[str, tuple[Option, Any]]:
    """Name -> (option, provenance) of the options the installed plugins declare."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return installed_plugin_manager().options(reserved=RolloutConfig.option_names())


def canonical_keys(values: dict[str, Any]) -> dict[str, Any]:
    """Option keys with underscores for dashes and slime's long names for the short ones (:data:`ALIASES`)."""
    return {ALIASES.get(k, k): v for k, v in ((k.replace("-", "_"), v) for k, v in values.items())}


def environment_options(name: str, pm: RlsdkPluginManager | None, *, train: bool) -> dict[str, Any]:
    """The run options environment ``name`` sets (with ``train`` also its ``train_settings``), by the plugins of
    ``pm`` (default the installed ones); an option no one declares is a ValueError naming the environment."""
    manager = pm or installed_plugin_manager()
    try:
        resolved = manager.resolve("environment", name)
    except PluginError:
        if not is_verifiers_module(name):  # a module exporting verifiers' load_environment
            raise
        resolved = Resolved(
            verifiers_environment(name), PluginInfo(plugin=name, module=name.replace("-", "_"))
        )
    settings = call_environment(resolved)
    if train:
        settings.update(resolved.record.train_settings)
    options = canonical_keys(settings)
    options.pop("env", None)
    known = {*core_options(), *declared_options(pm), *slime_argument_names()}
    unknown = sorted(k for k in options if k not in known and not k.startswith(("sglang_", "router_")))
    if unknown:
        raise ValueError(f"{resolved.describe()} sets unknown options {unknown} (see `rlsdk run --help`)")
    return options


def installed_options() -> dict[str, Option]:
    """The options the installed plugins declare."""
    return {name: option for name, (option, _) in installed_plugin_options().items()}


def declared_options(pm: Any) -> dict[str, Option]:
    """The options the plugins of ``pm`` declare (None: the installed plugins')."""
    if pm is None:
        return installed_options()
    return {name: option for name, (option, _) in pm.options(reserved=RolloutConfig.option_names()).items()}


@functools.cache
def slime_argument_names() -> frozenset[str]:
    """slime's arguments rlsdk has no option for but accepts, for slime functions that read them."""
    return frozenset(SLIME_ARG_DEFAULTS)


FINITE_OPTIONS = ("rollout_temperature", "rollout_top_p", "eval_temperature", "eval_top_p", "lr")
"""Options that must be finite numbers (NaN is refused in every option)."""


def check_numbers(config: Any) -> None:
    """NaN in any option, or an infinite sampling parameter or learning rate, is an error at start (X2), not
    a failure at step 0."""
    for option in dataclasses.fields(config):
        value = getattr(config, option.name)
        if isinstance(value, float) and (
            math.isnan(value) or (option.name in FINITE_OPTIONS and not math.isfinite(value))
        ):
            raise ValueError(f"{option.name} must be a finite number, got {value}")
