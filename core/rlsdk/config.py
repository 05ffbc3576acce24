"""The run configuration handed to every plugin as ``args``; attribute names follow slime's arguments."""

from __future__ import annotations

import dataclasses
import difflib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .training.options import ADVANTAGE_ESTIMATORS, KL_LOSS_TYPES, LOSS_TYPES, TrainingOptions

DEFAULT_DATASET = Path(__file__).parent / "datasets" / "arithmetic-train.jsonl"
DEFAULT_EVAL_DATASET = Path(__file__).parent / "datasets" / "arithmetic-eval.jsonl"
DEMO_TRAINING = {"num_rollout": 16, "rollout_batch_size": 8, "n_samples_per_prompt": 8, "lr": 1e-5,
                 "rollout_max_response_len": 40, "eval_interval": 4, "n_samples_per_eval_prompt": 2,
                 "rollout_shuffle": True}
"""``rlsdk run --train`` on the shipped data: settings that apply unless given (others keep slime's defaults)."""


@dataclass
class RolloutConfig(TrainingOptions):
    """Everything a run needs: the rollout step's options here, the trainer's in
    :class:`~rlsdk.training.options.TrainingOptions`. Unknown keys from a config file land in ``extra`` and read as
    attributes, so a plugin can take options of its own (``args.retriever_url``)."""

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
    rm_url: str | None = None
    """URL of the remote reward model for the ``remote`` reward."""
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
    grader_timeout: float = 10.0
    """Seconds one grading may run in a worker process (``math``, ``slime_math``, ``deepscaler``)
    before the worker is killed and the sample marked invalid."""
    grader_workers: int | None = None
    """Worker processes for CPU-heavy grading; default ``min(4, cpu_count)``."""
    rm_request_timeout: float = 30.0
    """Seconds per HTTP request of the ``remote`` reward."""
    rm_retries: int = 3
    """Retries of the ``remote`` reward on connection errors, timeouts and 5xx (never on 4xx)."""
    rm_backoff: float = 0.5
    """Base seconds of the ``remote`` reward's exponential backoff (full jitter) between retries."""
    rm_max_connections: int = 64
    """Connections the ``remote`` reward keeps open to its server at most."""
    dynamic_sampling_filter_path: str | None = None
    """The dynamic_filter plugin applied to each finished group; none keeps every group."""
    over_sampling_filter_path: str | None = None
    """The over_sampling_filter plugin that orders kept groups before the batch is cut."""
    buffer_filter_path: str = "pop_first"
    """The buffer_filter plugin that chooses which buffered groups are served first."""
    buffer_max_staleness: int | None = None
    """For the ``drop_stale`` buffer filter: drop (and count) buffered groups whose generation started
    more than this many steps before the current one; none keeps every group."""
    dynamic_filter_metric_key: str = "acc"
    """For the ``check_metric_nonzero_std`` dynamic filter: the dict-reward key it reads (e.g. DAPO's
    ``acc``) instead of the shaped reward selected by ``reward_key``."""
    reward_range_min: float = 0.0
    """For the ``reward_range`` dynamic filter: groups need a mean reward strictly above this."""
    reward_range_max: float = 1.0
    """For the ``reward_range`` dynamic filter: groups need a mean reward strictly below this."""

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
    """URL of the SGLang server or router for the ``sglang`` engine; default from ``sglang_router_ip``/``_port``."""
    sglang_launch: bool = False
    """Let the ``sglang`` engine start ``python -m sglang.launch_server`` for ``model`` (needs SGLang and a GPU)."""
    sglang_python: str | None = None
    """Python interpreter with SGLang installed, used when ``sglang_launch``; default this one."""
    sglang_retries: int = 5
    """Times the ``sglang`` engine retries a request on connection errors, with exponential backoff."""
    engine_device: str = "auto"
    """Device of the embedded engine: ``auto`` (CUDA when available), ``cpu`` or ``cuda``."""
    engine_dtype: str = "float32"
    """Weights dtype of the embedded engine; float32 keeps log-probs exact, ``bfloat16`` is faster on GPU."""
    engine_max_batch_size: int = 64
    """Rows the embedded engine decodes together; further requests wait."""
    engine_static_decode: bool | None = None
    """Embedded engine: decode steps over fixed cache buffers, replayed from CUDA graphs on CUDA (default
    there for models whose layers all attend to the whole context); ``false``: every step eager."""
    engine_threads: int | None = None
    """CPU threads for the embedded engine's torch; default all cores but one."""
    model_cache_dir: str | None = None
    """Folder for the embedded engine's converted default model; default ``$RLSDK_CACHE_DIR/models`` or
    ``~/.cache/rlsdk/models``."""

    # --- data ---
    prompt_data: str | None = None
    """Training data: JSONL or Parquet, with an optional ``@[start:end]`` row slice. ``rlsdk run``
    without it uses the shipped single-digit arithmetic set (see :meth:`with_default_data`)."""
    input_key: str = "input"
    """Row key holding the prompt (a string or chat messages)."""
    label_key: str | None = None
    """Row key holding the label."""
    metadata_key: str = "metadata"
    """Row key holding per-row metadata."""
    tool_key: str = "tools"
    """Row key holding tool definitions for the chat template."""
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
    max_turns: int = 4
    """Model turns per sample in multi-turn generators."""
    tool_names: list[str] = field(default_factory=list)
    """Tool plugins the ``multi_turn`` generator may call; empty: those named in ``metadata["tools"]``."""
    tool_call_format: str = "auto"
    """How ``multi_turn`` reads tool calls: ``tag`` (``<name>...</name>``), ``json`` (the chat
    template's ``<tool_call>`` JSON) or ``auto`` (either)."""
    rollout_buffer_url: str | None = None
    """Address of ``rlsdk buffer serve`` for the ``rollout_buffer`` rollout (slime's ``--rollout-buffer-url``)."""
    rollout_task_type: str | None = None
    """The task_generator plugin the ``rollout_buffer`` rollout starts on the buffer service."""
    rollout_buffer_wait: float = 600.0
    """Seconds the ``rollout_buffer`` rollout waits for enough complete groups before failing."""

    # --- eval ---
    eval_prompt_data: list[str] = field(default_factory=list)
    """Eval datasets as ``name path`` pairs flattened, as slime takes them."""
    eval_datasets: list[dict[str, Any]] = field(default_factory=list)
    """Eval datasets with overrides each: ``{"name", "path", "rm_type", "n_samples_per_eval_prompt",
    "eval_temperature", "eval_top_p", "eval_max_response_len", "eval_reward_key"}``."""
    n_samples_per_eval_prompt: int = 1
    eval_temperature: float | None = None
    eval_top_p: float | None = None
    eval_max_response_len: int | None = None
    eval_interval: int | None = None
    """Run eval every this many steps; none runs no eval during ``rlsdk run``."""

    # --- output ---
    output_dir: str = "rlsdk-out"
    """Folder for rollouts.jsonl, metrics.jsonl and the resume state."""
    resume: bool = False
    """Continue from the state saved in ``output_dir``."""
    overwrite: bool = False
    """Start afresh in an ``output_dir`` that holds a run (otherwise that is an error)."""

    extra: dict[str, Any] = field(default_factory=dict)
    """Options not known to rlsdk, kept for plugins."""

    def __getattr__(self, name: str) -> Any:
        extra = self.__dict__.get("extra", {})
        if name in extra:
            return extra[name]
        from .slime_args import SLIME_ARG_DEFAULTS  # slime's arguments that slime functions read

        if name in SLIME_ARG_DEFAULTS:
            return SLIME_ARG_DEFAULTS[name]
        raise AttributeError(f"{type(self).__name__} has no option {name!r}")

    def __post_init__(self) -> None:
        if self.over_sampling_batch_size is None:
            self.over_sampling_batch_size = self.rollout_batch_size
        for name in ("rollout_batch_size", "n_samples_per_prompt", "over_sampling_batch_size", "num_rollout",
                     "sglang_server_concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.on_bad_row not in ("error", "skip"):
            raise ValueError(f"on_bad_row must be error or skip, got {self.on_bad_row!r}")
        if self.tool_call_format not in ("auto", "tag", "json"):
            raise ValueError(f"tool_call_format must be auto, tag or json, got {self.tool_call_format!r}")
        if self.on_failed_step not in ("fail", "continue"):
            raise ValueError(f"on_failed_step must be fail or continue, got {self.on_failed_step!r}")
        if self.on_invalid_reward not in ("fail", "drop_group", "score"):
            raise ValueError(
                f"on_invalid_reward must be fail, drop_group or score, got {self.on_invalid_reward!r}"
            )
        for name, choices in (("advantage_estimator", ADVANTAGE_ESTIMATORS), ("loss_type", LOSS_TYPES),
                              ("kl_loss_type", KL_LOSS_TYPES)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        if self.loss_type == "custom_loss" and not self.custom_loss_function_path:
            raise ValueError("loss_type custom_loss needs custom_loss_function_path (a loss name or dotted path)")
        if self.use_tis and self.use_rollout_logprobs:
            raise ValueError("use_tis and use_rollout_logprobs cannot be set together (as in slime)")

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name != "extra"]

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, strict: bool = False) -> RolloutConfig:
        """Build from a mapping; dashes in keys become underscores. Unknown keys go to ``extra``
        (or raise, with a suggestion, when ``strict``)."""
        known = set(cls.option_names())
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = dict(values.get("extra", {}))
        for key, value in values.items():
            if key == "extra":
                continue
            name = key.replace("-", "_")
            if name in known:
                kwargs[name] = value
            elif strict:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"unknown option {key!r}{hint}")
            else:
                extra[name] = value
        return cls(**kwargs, extra=extra)

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
    def from_file(cls, path: str | Path, **overrides: Any) -> RolloutConfig:
        """Build from a YAML, TOML or JSON file, then apply ``overrides`` (e.g. from the CLI)."""
        return cls.from_dict({**cls.read_file(path), **overrides})

    def with_default_data(self, given: set[str] | frozenset[str] = frozenset()) -> RolloutConfig:
        """With no ``prompt_data``: the shipped arithmetic training set, its ``label`` key and the chat
        template; with ``train`` also the disjoint eval set and :data:`DEMO_TRAINING` for the options not
        in ``given``."""
        if self.prompt_data is None:
            self.prompt_data = str(DEFAULT_DATASET)
            self.label_key = self.label_key or "label"
            self.apply_chat_template = True
            if self.train:
                for name, value in DEMO_TRAINING.items():
                    if name not in given:
                        setattr(self, name, value)
                if "over_sampling_batch_size" not in given:
                    self.over_sampling_batch_size = self.rollout_batch_size
                if not self.eval_datasets and not self.eval_prompt_data:
                    self.eval_datasets = [{"name": "arithmetic-eval", "path": str(DEFAULT_EVAL_DATASET)}]
                self.__post_init__()
        return self

    def replace(self, **changes: Any) -> RolloutConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
