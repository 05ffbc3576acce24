"""The run configuration handed to every plugin as ``args``; attribute names follow slime's arguments."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import tomllib
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from .engines.launch.arguments import check_passthrough
from .algorithm_options import AlgorithmOptions, check_algorithm_options
from .errors import PluginError
from .plugins.calls import call_environment
from .plugins.manager import RlsdkPluginManager, get_plugin_manager
from .plugins.records import Option, PluginInfo, Resolved
from .plugins.verifiers_envs import is_verifiers_module, verifiers_environment
from .slime_args import SLIME_ARG_DEFAULTS, SLIME_FIXED_CHOICES
from .training_options import (
    ADVANTAGE_ESTIMATORS,
    KL_LOSS_TYPES,
    LOSS_TYPES,
    WEIGHT_SYNC_MODES,
    WEIGHTS_CHECK_MODES,
    TrainingOptions,
    option_docs,
)

DEFAULT_ENVIRONMENT = "arithmetic"
"""The environment ``rlsdk run`` takes without ``prompt_data`` or ``env``: single-digit arithmetic, shipped in core."""
DATASETS = Path(__file__).parent / "datasets"
"""The datasets that ship inside core (the arithmetic environment's among them)."""


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


@dataclass(init=False)
class RolloutConfig(TrainingOptions):
    """Everything a run needs: core's options, the rollout step's here and the trainer's in
    :class:`~rlsdk.training_options.TrainingOptions`. Plugins declare options of their own (``rlsdk_options``):
    they are kept in ``extra`` and read as attributes (``args.retriever_url``), their default when unset."""

    # --- plugins, by registered name or dotted path ---
    rollout_function_path: str = "sglang"
    """The generate_rollout plugin: one training or eval step."""
    eval_function_path: str | None = None
    """The generate_rollout plugin for eval; defaults to ``rollout_function_path``."""
    custom_generate_function_path: str | None = None
    """The custom_generate plugin that turns one sample into a response; default single-turn generate."""
    rm_type: str = "math"
    """The reward plugin; a sample's ``metadata["rm_type"]`` overrides it."""
    custom_rm_path: str | None = None
    """A reward by dotted path that takes precedence over ``rm_type`` (slime's ``--custom-rm-path``)."""
    group_rm: bool = False
    """Call a dotted-path reward once per group with the list of samples."""
    reward_key: str | None = None
    """Key selecting the training reward from dict rewards."""
    eval_reward_key: str | None = None
    """Key selecting the eval reward from dict rewards; defaults to ``reward_key``."""
    on_invalid_reward: str = "drop_group"
    """What an invalid reward (timeout, crash, wrong type) does: ``fail``, ``drop_group`` or ``score``."""
    invalid_reward_value: float = 0.0
    """The reward given to invalid samples when ``on_invalid_reward`` is ``score``."""
    on_failed_step: str = "fail"
    """A training step whose every sample failed: ``fail`` stops the run with the causes (a non-zero exit),
    ``continue`` goes on to the next step."""
    reward_timeout: float = 60.0
    """Wall-clock seconds one sample's reward (or one group reward) may take before it is marked invalid."""
    dynamic_sampling_filter_path: str | None = None
    """The dynamic_filter plugin applied to each finished group; none keeps every group."""
    over_sampling_filter_path: str | None = None
    """The over_sampling_filter plugin that orders kept groups before the batch is cut."""
    buffer_filter_path: str = "pop_first"
    """The buffer_filter plugin that chooses which buffered groups are served first."""
    rollout_sample_hook_path: list[str] = field(default_factory=list)
    """sample_hook plugins applied, in order, to every generated sample before its reward."""
    rollout_sample_filter_path: str | None = None
    """A rollout_sample_filter plugin that marks kept samples ``remove_sample`` (out of the loss)."""
    rollout_all_samples_process_path: str | None = None
    """An all_samples_process plugin that sees every group a step finished, kept and dropped."""
    data_source_path: str | None = None
    """A data_source plugin that serves the groups; default rlsdk's (``prompt_data``, buffer, resume)."""
    custom_rollout_log_function_path: str | None = None
    """rollout_log plugins (``jsonl``, ``tensorboard``, ``wandb``, ...; several joined by commas) that log
    every step beside ``metrics.jsonl``."""
    custom_eval_rollout_log_function_path: str | None = None
    """eval_rollout_log plugins (several joined by commas) that log every eval."""
    log_timeout: float | None = 600.0
    """Seconds one rollout_log or eval_rollout_log backend may take for one step or eval before the run stops
    naming it; none waits forever. A stop signal (SIGTERM, SIGINT) ends the wait at once either way."""
    checkpoint_callback: str | None = None
    """checkpoint_callback plugins (several joined by commas) called after each checkpoint is complete."""
    env: str | None = None
    """An environment plugin whose settings (data, reward or rubric, generator, eval sets, options) the run
    takes; options given on the command line or in a config file win over them."""

    custom_config_path: str | None = None
    """slime's custom config: a YAML file whose values are set on ``args`` over every other setting, those
    that are no option too (for custom functions that read them)."""

    # --- engine ---
    engine: str = "embedded"
    """The engine: ``embedded``, ``sglang``, another engine plugin, or an SGLang server/router URL."""
    model: str | None = None
    """Model for the embedded engine: a local Hugging Face folder; default SmolLM2-135M-Instruct."""
    hf_checkpoint: str | None = None
    """Tokenizer/model folder used for chat templates when it differs from ``model``."""
    sglang_router_ip: str | None = None
    """Host of the engine's HTTP endpoint in use (set by the engine when a run starts)."""
    sglang_router_port: int | None = None
    """Port of the engine's HTTP endpoint in use (set by the engine when a run starts)."""
    sglang_server_concurrency: int = 512
    """Requests in flight at once per engine."""
    sglang_url: str | None = None
    """URL of the SGLang server or router for the ``sglang`` engine; default from ``sglang_router_ip``/``_port``;
    with neither, the engine launches SGLang on this machine's GPUs (``rollout_num_gpus``, ``colocate``)."""
    sglang_launch: bool = False
    """Launch SGLang even though ``sglang_router_ip``/``_port`` are set (they then name the router's address)."""
    sglang_python: str | None = None
    """Python interpreter with SGLang installed, used for launched servers; default this one."""
    sglang_retries: int = 5
    """Times the ``sglang`` engine retries a request on connection errors and HTTP 5xx (never on 4xx), with
    exponential backoff; then the sample fails with the reason and its prompt is served again later."""
    sglang_backoff: float = 0.25
    """Base seconds of the ``sglang`` engine's exponential backoff (full jitter, at most 10 s a wait)."""

    # --- Ray (rlsdk[ray]) ---
    ray_address: str | None = None
    """Run on Ray: ``local`` starts a cluster on this machine (dashboard off), ``auto`` or ``ray://host:port``
    joins a running one; engines run as actors, CPU-heavy grading as tasks. None: no Ray."""
    num_engines: int = 1
    """Engine actors on Ray; requests go to the least-loaded one, a dead one is restarted."""
    ray_runtime_env: dict[str, Any] | None = None
    """Ray runtime environment for the workers (``env_vars``, ``pip``, ``working_dir``...), as Ray takes it
    (``--runtime-env`` JSON)."""
    ray_engine_cpus: float = 1.0
    """Logical CPUs each engine actor asks Ray for."""
    ray_spare_engines: int = 0
    """Engine actors kept started beside the serving ones, each ready to take a dead engine's place at once
    (it then takes the current weights and the trust check); each costs an engine's CPUs and memory."""
    ray_sync_rewards: bool = False
    """Plain (sync, not ``cheap``) rewards run as Ray tasks across the cluster, one CPU each, instead of in
    the driver's threads: each task resolves the reward from its node's environment (a path must name the
    same file there), and a task whose worker dies runs again elsewhere. For CPU-heavy rewards."""
    ray_standby_engines: int | None = None
    """Engine actors kept prepared beside the serving ones (process up, the engine's imports done, no model
    loaded), each ready to start in a dead engine's place: a restart then only loads the model and the
    weights. Each asks Ray for an engine's resources and holds a process's imports in memory (0: none).
    Default one, but none for SGLang engines on GPUs: a standby holds its GPUs idle, so ask for one only
    with GPUs to spare (more engine actors than the cluster has GPUs for is an error before the start)."""
    ray_start_timeout: float = 300.0
    """Seconds an actor may take to be placed, start and load its model before the run stops naming its
    node, device, port and log file."""
    rollout_health_check_timeout: float = 30.0
    """Seconds an engine on Ray may take to answer a health check (checked every second) before it is taken
    for hung and replaced, as slime's flag; one that answers requests meanwhile is busy, not hung."""

    # --- data ---
    prompt_data: str | None = None
    """Training data: JSONL or Parquet, with an optional ``@[start:end]`` row slice. ``rlsdk run``
    without it uses the shipped single-digit arithmetic set and the demo's settings (``--print-config``
    shows them)."""
    input_key: str = "input"
    """Row key holding the prompt (a string or chat messages)."""
    label_key: str | None = None
    """Row key holding the label."""
    metadata_key: str = "metadata"
    """Row key holding per-row metadata."""
    tool_key: str = "tools"
    """Row key holding tool definitions for the chat template."""
    multimodal_keys: dict[str, str] | None = None
    """Row keys holding each prompt's media, by type (``{"image": "images"}``): the prompt's ``<image>``
    placeholders become those images, in order (slime's ``--multimodal-keys``)."""
    apply_chat_template: bool = False
    """Render prompts through the tokenizer's chat template."""
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra chat-template arguments, such as ``enable_thinking``."""
    rollout_max_prompt_len: int | None = None
    """Drop (and count) prompts longer than this many tokens."""
    rollout_shuffle: bool = False
    """Shuffle the data each epoch with a seed of ``rollout_seed`` and the epoch."""
    rollout_seed: int = 42
    """Seed for shuffling and for deterministic sampling."""
    on_bad_row: str = "error"
    """A malformed data row: ``error`` stops the run naming file and line, ``skip`` counts and goes on."""

    # --- rollout step ---
    num_rollout: int = 3
    """Rollout steps to run."""
    rollout_batch_size: int = 4
    """Groups (prompts) kept per step."""
    n_samples_per_prompt: int = 4
    """Samples generated per prompt (the group size)."""
    over_sampling_batch_size: int | None = None
    """Groups submitted per chunk; defaults to ``rollout_batch_size``."""
    rollout_max_response_len: int = 128
    """Maximum new tokens per response."""
    rollout_temperature: float = 1.0
    rollout_top_p: float = 1.0
    rollout_top_k: int = -1
    rollout_stop: list[str] | None = None
    """Stop strings."""
    rollout_stop_token_ids: list[int] | None = None
    """Stop token ids (EOS always stops)."""
    rollout_skip_special_tokens: bool = False
    sglang_enable_deterministic_inference: bool = False
    """Give sample ``i`` of a group the sampling seed ``rollout_seed + i``."""
    partial_rollout: bool = False
    """Return unfinished groups to the buffer at the end of a step and resume them later."""
    mask_offpolicy_in_partial_rollout: bool = False
    """Loss-mask tokens generated before a partial rollout resumed."""
    rollout_max_groups_per_step: int | None = None
    """Stop pulling data after this many groups in one step (default 8x ``rollout_batch_size``), so a
    filter that drops everything cannot loop forever; the step then returns fewer groups."""
    generate_timeout: float | None = 600.0
    """Seconds one sample's generation may take before it fails as hung; none waits forever."""
    abort_timeout: float = 30.0
    """Seconds to wait for aborted requests to return their partial output at the end of a step."""

    # --- multi-turn and agents ---
    rollout_max_context_len: int | None = None
    """Prompt plus response tokens allowed per sample; multi-turn generators clamp each turn to it."""
    agent_function_path: str | None = None
    """The agent plugin (or dotted path) the ``openai_agent`` or ``anthropic_agent`` custom_generate runs
    for each sample."""
    max_turns: int = 4
    """Model turns per sample for multi-turn generators and agents (``multi_turn``, ``search_r1``,
    ``tool_agent``, and third-party ones that read it)."""
    tool_call_parser: str = "auto"
    """How ``/v1/chat/completions`` and ``/v1/messages`` read tool calls, per model family: a
    tool_call_parser plugin (``json``, ``hermes``) or ``auto`` (``hermes`` for chat templates that write
    ``<tool_call>``, else ``json``)."""

    # --- eval ---
    eval_prompt_data: list[str] = field(default_factory=list)
    """Eval datasets as ``name path`` pairs flattened, as slime takes them."""
    eval_datasets: list[dict[str, Any]] = field(default_factory=list)
    """Eval datasets, each ``{"name", "path"}`` and any setting of slime's ``EvalDatasetConfig``
    (``rm_type``, ``n_samples_per_eval_prompt``, ``temperature``, ``max_response_len``, ``input_key``...)
    or ``reward_key``; unset ones are the run's (:mod:`rlsdk.data.eval_sets`)."""
    eval_config: str | None = None
    """slime's multi-task eval file (YAML or JSON): ``eval: {defaults: {...}, datasets: [...]}``, each
    dataset's settings over the defaults over the run's options; replaces ``eval_prompt_data``."""
    n_samples_per_eval_prompt: int = 1
    eval_temperature: float | None = None
    eval_top_p: float | None = None
    eval_max_response_len: int | None = None
    eval_interval: int | None = None
    """Run eval every this many steps and after the last; none runs no eval during ``rlsdk run``. A training
    run also evaluates before its first step, unless ``skip_eval_before_train``."""
    skip_eval_before_train: bool = False
    """Skip the eval before the first training step (the curve's starting point), as slime's flag."""

    # --- output ---
    output_dir: str = "rlsdk-out"
    """Folder for rollouts.jsonl, metrics.jsonl and the resume state."""
    resume: bool = False
    """Continue from the state saved in ``output_dir``."""
    overwrite: bool = False
    """Start afresh in an ``output_dir`` that holds a run (otherwise that is an error)."""

    extra: dict[str, Any] = field(default_factory=dict)
    """The plugins' options given for this run (and slime's arguments that rlsdk has no option for)."""

    def __init__(self, **values: Any) -> None:
        """Core options by keyword, and the installed plugins' options (kept in ``extra``); an unknown key is a
        ValueError with a did-you-mean. ``extra`` itself is taken as given (it was checked when built)."""
        extra = dict(values.pop("extra", None) or {})
        fields = [f for f in dataclasses.fields(self) if f.name != "extra"]
        names = {f.name for f in fields}
        loose = {key: values.pop(key) for key in [k for k in values if k not in names]}
        if loose:  # only then are the installed plugins loaded
            extra.update(plugin_values(loose, installed_options()))
        for f in fields:
            if f.name in values:
                value = values[f.name]
            else:
                value = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            setattr(self, f.name, value)
        self.extra = extra
        self.__post_init__()

    if not TYPE_CHECKING:  # mypy sees only the fields: core's reads of ``args`` are checked against them

        def __getattr__(self, name: str) -> Any:
            """A plugin option (set in ``extra``, else its declared default) or one of slime's arguments."""
            extra = self.__dict__.get("extra", {})
            if name in extra:
                return extra[name]
            if not name.startswith("_"):
                declared = installed_options()
                if name in declared:
                    return declared[name].default
                if name in SLIME_ARG_DEFAULTS:
                    return SLIME_ARG_DEFAULTS[name]
            raise AttributeError(f"{type(self).__name__} has no option {name!r}")

    def __post_init__(self) -> None:
        if self.over_sampling_batch_size is None:
            self.over_sampling_batch_size = self.rollout_batch_size
        for name in (
            "rollout_batch_size",
            "n_samples_per_prompt",
            "over_sampling_batch_size",
            "num_rollout",
            "sglang_server_concurrency",
            "num_engines",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        check_numbers(self)
        for name, value in SLIME_FIXED_CHOICES.items():
            if self.extra.get(name, value) != value:
                raise ValueError(
                    f"{name} {self.extra[name]!r}: rlsdk's trainers take {value!r} only (AdamW, constant lr)"
                )
        if self.num_engines > 1 and not self.ray_address:
            raise ValueError(
                f"num_engines {self.num_engines} needs ray_address (--ray): engines are Ray actors"
            )
        if self.on_bad_row not in ("error", "skip"):
            raise ValueError(f"on_bad_row must be error or skip, got {self.on_bad_row!r}")
        if self.on_failed_step not in ("fail", "continue"):
            raise ValueError(f"on_failed_step must be fail or continue, got {self.on_failed_step!r}")
        if self.on_invalid_reward not in ("fail", "drop_group", "score"):
            raise ValueError(
                f"on_invalid_reward must be fail, drop_group or score, got {self.on_invalid_reward!r}"
            )
        for name, choices in (
            ("advantage_estimator", ADVANTAGE_ESTIMATORS),
            ("loss_type", LOSS_TYPES),
            ("kl_loss_type", KL_LOSS_TYPES),
            ("weight_sync", WEIGHT_SYNC_MODES),
            ("weights_check", WEIGHTS_CHECK_MODES),
            ("update_weight_mode", ("full", "delta")),
            ("update_weight_delta_encoding", ("xor", "overwrite")),
            ("update_weight_delta_checksum", ("xxh3-128", "blake3", "adler32")),
        ):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        if self.loss_type == "custom_loss" and not self.custom_loss_function_path:
            raise ValueError(
                "loss_type custom_loss needs custom_loss_function_path (a loss name or dotted path)"
            )
        if self.keep_last_n is not None and self.keep_last_n < 1:
            raise ValueError(
                f"keep_last_n must be at least 1 (the checkpoint --resume needs), got {self.keep_last_n}"
            )
        if self.use_tis and self.use_rollout_logprobs:
            raise ValueError("use_tis and use_rollout_logprobs cannot be set together (as in slime)")
        check_algorithm_options(self, self.advantage_estimator)
        if self.lora_rank and self.ray_address:
            raise ValueError(
                "lora_rank: LoRA runs do not run on Ray yet (its engine pool takes whole weights)"
            )
        if self.max_policy_version_lag is not None and self.max_policy_version_lag < 0:
            raise ValueError(f"max_policy_version_lag must be 0 or more, got {self.max_policy_version_lag}")
        if self.update_weight_mode == "delta" and self.weight_sync not in ("auto", "disk"):
            raise ValueError(
                f"update_weight_mode delta syncs through disk: --update-weight-transport disk, not {self.weight_sync}"
            )
        if self.update_weight_buffer_size < 1:
            raise ValueError(
                f"update_weight_buffer_size must be at least 1 byte, got {self.update_weight_buffer_size}"
            )
        if self.weight_sync_timeout is not None and not self.weight_sync_timeout > 0:
            raise ValueError(f"weight_sync_timeout must be above 0 seconds, got {self.weight_sync_timeout}")
        if self.colocate and (self.train_async or self.max_policy_version_lag is not None):
            raise ValueError(
                "--async and --max-policy-version-lag generate while the trainer trains: they need the "
                "engines on GPUs of their own, not --colocate"
            )

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name != "extra"]

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, pm: Any = None) -> RolloutConfig:
        """Build from a mapping (a config file, ``--set``, the command line); dashes in keys become underscores.

        Every value is checked against its option: core's (this class's fields), the options the plugins of
        ``pm`` declare (default: the installed ones; they land in ``extra``, with the defaults of the rest when
        ``pm`` is given) or slime's arguments. An unknown key or a value of the wrong type is a ValueError
        naming it, with a did-you-mean."""
        declared = declared_options(pm)
        given = canonical_keys({k: v for k, v in values.items() if k != "extra"})
        given.update(values.get("extra") or {})
        if given.get("env"):  # the environment's settings, under every option given
            given = {**environment_options(given["env"], pm, train=bool(given.get("train"))), **given}
        custom = custom_config(given.get("custom_config_path"), declared)
        given.update(
            {key: value for key, value in custom.items() if key in core_options() or key in declared}
        )
        core = core_options()
        core_values = {key: core[key].check(value) for key, value in given.items() if key in core}
        extra = plugin_values({k: v for k, v in given.items() if k not in core}, declared)
        extra.update({key: value for key, value in custom.items() if key not in core and key not in declared})
        if pm is not None:
            extra = {**{name: option.default for name, option in declared.items()}, **extra}
        return cls(**core_values, extra=extra)

    @staticmethod
    def read_file(path: str | Path) -> dict[str, Any]:
        """The options of a YAML, TOML or JSON file."""
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"config file {path}: {exc.strerror or exc}") from None
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
        """With neither ``prompt_data`` nor ``env``: the shipped arithmetic environment (its training set,
        ``label`` key and chat template; with ``train`` also its disjoint eval set and demo training settings),
        for the options not in ``given``."""
        if self.prompt_data is None and self.env is None:
            self.env = DEFAULT_ENVIRONMENT
            core = core_options()
            for name, value in environment_options(DEFAULT_ENVIRONMENT, None, train=self.train).items():
                if name not in given:
                    setattr(self, name, core[name].check(value))
            if "over_sampling_batch_size" not in given:
                self.over_sampling_batch_size = self.rollout_batch_size
            self.__post_init__()
        return self

    def replace(self, **changes: Any) -> RolloutConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
    docs = {**option_docs(AlgorithmOptions), **option_docs(TrainingOptions), **option_docs(RolloutConfig)}
    hints = typing.get_type_hints(RolloutConfig)
    options = {}
    for f in dataclasses.fields(RolloutConfig):
        if f.name == "extra":
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
