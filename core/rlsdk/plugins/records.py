"""Records that plugins return from provider hooks: one per named implementation."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from .loading import is_async_callable
from .tool_schema import schema_from_signature


def normalize_name(name: str) -> str:
    """Registered names are compared lower-cased and stripped."""
    return name.strip().lower()


@dataclass
class PluginRecord:
    """A named implementation of one kind; ``func`` is what the engine loop calls."""

    kind: ClassVar[str] = ""
    hook: ClassVar[str] = ""
    """The provider hook's name; ``rlsdk_<kind>s`` unless a record type says otherwise."""
    call_args: ClassVar[tuple[str, ...]] = ()
    """Positional arguments the loop passes, used to validate the callable's signature."""
    call_keywords: ClassVar[tuple[str, ...]] = ()
    """Keyword arguments the loop passes (slime calls some hooks by keyword), validated the same way."""

    name: str
    func: Callable[..., Any]
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"a {self.kind} record needs a non-empty name, got {self.name!r}")
        self.name = normalize_name(self.name)
        if "." in self.name or ":" in self.name or "/" in self.name:
            raise ValueError(f"{self.kind} name {self.name!r} may not contain '.', ':' or '/'")
        if not callable(self.func):
            raise TypeError(f"{self.kind} {self.name!r}: func must be callable, got {self.func!r}")
        if not self.description:
            doc = (getattr(self.func, "__doc__", None) or "").strip()
            self.description = doc.splitlines()[0] if doc else ""

    def signature_args(self) -> tuple[str, ...]:
        """The positional arguments the callable must accept: :attr:`call_args`, for most kinds."""
        return self.call_args


@dataclass
class GenerateRollout(PluginRecord):
    """``generate_rollout(args, rollout_id, data_source, evaluation=False)``: one whole step."""

    kind: ClassVar[str] = "generate_rollout"
    call_args: ClassVar[tuple[str, ...]] = ("args", "rollout_id", "data_source")
    chat_messages: bool = False
    """The rollout takes chat-message prompts as messages (it applies the chat template itself, as ``sft``
    does): without ``apply_chat_template`` the data source keeps them instead of refusing them."""


@dataclass
class CustomGenerate(PluginRecord):
    """``async custom_generate(args, sample, sampling_params[, evaluation])``: one sample's response."""

    kind: ClassVar[str] = "custom_generate"
    call_args: ClassVar[tuple[str, ...]] = ("args", "sample", "sampling_params")


@dataclass
class Reward(PluginRecord):
    """``async reward(args, sample, **kwargs)``; with ``group=True``, ``reward(args, samples)`` returns a
    list of rewards, one per sample."""

    kind: ClassVar[str] = "reward"
    call_args: ClassVar[tuple[str, ...]] = ("args", "sample")
    group: bool = False
    cheap: bool = False
    """A plain (sync) function that returns in microseconds, e.g. an exact-match comparison. The rollout
    loop calls it inline on its event loop instead of in a worker thread: no thread hop per sample, but
    also no ``reward_timeout``, so a cheap reward must never block or hang."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cheap and is_async_callable(self.func):
            raise ValueError(
                f"reward {self.name!r}: cheap=True is for plain functions; async rewards never "
                "leave the event loop anyway"
            )


@dataclass
class DynamicFilter(PluginRecord):
    """``dynamic_filter(args, samples, **kwargs) -> DynamicFilterOutput | bool`` for one finished group."""

    kind: ClassVar[str] = "dynamic_filter"
    call_args: ClassVar[tuple[str, ...]] = ("args", "samples")


@dataclass
class OverSamplingFilter(PluginRecord):
    """``over_sampling_filter(args, groups, **kwargs) -> groups``: order the kept groups before the cut."""

    kind: ClassVar[str] = "over_sampling_filter"
    call_args: ClassVar[tuple[str, ...]] = ("args", "groups")


@dataclass
class BufferFilter(PluginRecord):
    """``buffer_filter(args, rollout_id, buffer, num_samples) -> groups``, removing them from ``buffer``."""

    kind: ClassVar[str] = "buffer_filter"
    call_args: ClassVar[tuple[str, ...]] = ("args", "rollout_id", "buffer", "num_samples")


@dataclass
class Engine(PluginRecord):
    """``engine(args) -> rlsdk.engines.engine.InferenceEngine``: a factory for an engine speaking SGLang's
    protocol."""

    kind: ClassVar[str] = "engine"
    call_args: ClassVar[tuple[str, ...]] = ("args",)
    check: Callable[[Any], None] | None = None
    """``check(args)``: raises on settings this engine cannot serve, with a one-line reason; ``rlsdk run``
    calls it before anything starts."""
    launches: Callable[[Any], bool] | None = None
    """``launches(args)``: whether the engine starts servers of its own on GPUs for these settings. On Ray
    each engine actor then asks for ``rollout_num_gpus_per_engine`` GPUs and launches one engine on them, and
    the pool keeps no standby (it would hold GPUs)."""


@dataclass
class Trainer(PluginRecord):
    """``trainer(args) -> rlsdk.PolicyTrainer``: a factory for the policy trainer of ``rlsdk run --train``."""

    kind: ClassVar[str] = "trainer"
    call_args: ClassVar[tuple[str, ...]] = ("args",)
    check: Callable[[Any], None] | None = None
    """``check(args)``: raises on settings this trainer cannot train with (a parallel size the model cannot
    be split by, say); ``rlsdk run`` calls it before any engine starts, so the error does not wait for them."""


@dataclass
class Loss(PluginRecord):
    """``loss(args, batch, logits, sum_of_sample_mean) -> (loss, metrics)``: slime's custom-loss signature."""

    kind: ClassVar[str] = "loss"
    hook: ClassVar[str] = "rlsdk_losses"
    call_args: ClassVar[tuple[str, ...]] = ("args", "batch", "logits", "sum_of_sample_mean")
    logits: str = "packed"
    """The ``logits`` the loss gets: ``packed``, slime's ``[1, sum(total_lengths), vocab]`` (what a slime
    loss reads, and a dotted-path loss gets), or ``response``, only the rows that predict response tokens,
    ``[1, sum(response_lengths), vocab]``: the trainer then computes no vocabulary projection for prompt
    positions and holds no copy of a group's prompt rows per sample. A loss that reads the logits through
    :func:`rlsdk.response_logits` (or ``log_probs_and_entropy``) works with either."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.logits not in ("packed", "response"):
            raise ValueError(
                f"loss {self.name!r}: logits must be 'packed' or 'response', got {self.logits!r}"
            )


@dataclass
class Tool(PluginRecord):
    """``tool(args, **arguments) -> str`` (sync or async): an action a multi-turn generator may take.

    ``parameters`` is the JSON schema of the arguments; when not given it is built from the callable's
    signature and docstring (type hints, defaults, ``:param x:`` or ``Args:`` lines; a ``**kwargs``-only
    tool takes one string ``query``). A tag-style call ``<name>text</name>`` passes ``text`` as the schema's
    single parameter. A call that runs past ``timeout`` seconds or raises becomes an error observation,
    never a crash.
    """

    kind: ClassVar[str] = "tool"
    parameters: dict[str, Any] = field(default_factory=dict)
    timeout: float = 30.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.parameters:
            self.parameters = schema_from_signature(self.func, f"tool {self.name!r}")
        if not (self.timeout > 0):
            raise ValueError(f"tool {self.name!r}: timeout must be positive, got {self.timeout!r}")

    def signature_args(self) -> tuple[str, ...]:
        """``args`` and the schema's required parameters, which the signature must accept."""
        return ("args", *self.parameters.get("required", []))

    @property
    def tag_argument(self) -> str | None:
        """The parameter a tag-style call fills: the only one (or the only required one), else None."""
        names = list(self.parameters.get("properties", {}))
        required = list(self.parameters.get("required", []))
        if len(names) == 1:
            return names[0]
        return required[0] if len(required) == 1 else None

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function definition that chat templates take in ``tools``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass
class TaskGenerator(PluginRecord):
    """``run_rollout(data)``: a rollout-buffer task (slime's ``TASK_TYPE`` module), named by task type.

    ``run_rollout`` gets the ``/start_rollout`` body and posts trajectories to its
    ``remote_buffer_url``. The optional group hooks have slime's signatures:
    ``is_valid_group((instance_id, items), group_size, task_type) -> bool``,
    ``transform_group((instance_id, items), task_type) -> (instance_id, items)`` and
    ``get_group_data_meta_info({instance_id: items}) -> dict``.
    """

    kind: ClassVar[str] = "task_generator"
    call_args: ClassVar[tuple[str, ...]] = ("data",)
    is_valid_group: Callable[..., bool] | None = None
    transform_group: Callable[..., Any] | None = None
    get_group_data_meta_info: Callable[..., dict[str, Any]] | None = None

    @classmethod
    def from_module(cls, module: Any, description: str = "") -> TaskGenerator:
        """A record from a slime generator module: ``TASK_TYPE``, ``run_rollout`` and optional hooks."""
        return cls(
            name=module.TASK_TYPE,
            func=module.run_rollout,
            description=description,
            is_valid_group=getattr(module, "is_valid_group", None),
            transform_group=getattr(module, "transform_group", None),
            get_group_data_meta_info=getattr(module, "get_group_data_meta_info", None),
        )


@dataclass
class ToolCallParser(PluginRecord):
    """``parse(text, tools) -> rlsdk.agents.ParsedTurn``: the content and tool calls of one model turn,
    for ``/v1/chat/completions``.

    ``marker`` is the text that starts a call (a stream holds content back from it until the turn ends).
    ``format_calls(calls) -> str`` writes calls back in the model's own format and ``tools_prompt(tools)
    -> str`` describes the tools, for chat templates that render neither (a re-rendered history, a
    system message)."""

    kind: ClassVar[str] = "tool_call_parser"
    call_args: ClassVar[tuple[str, ...]] = ("text", "tools")
    marker: str = ""
    format_calls: Callable[..., str] | None = None
    tools_prompt: Callable[..., str] | None = None


@dataclass
class Agent(PluginRecord):
    """``agent(args, sample, client) -> result`` (sync or async): an agent that talks to the model only
    through ``client``, an ``openai.OpenAI`` (``openai.AsyncOpenAI`` for async agents) bound to the
    sample's session, run by the ``openai_agent`` custom_generate; or the ``anthropic`` client's, run by
    ``anthropic_agent``."""

    kind: ClassVar[str] = "agent"
    call_args: ClassVar[tuple[str, ...]] = ("args", "sample", "client")


# ----- slime's other extension points -------------------------------------------------------------------


@dataclass
class SampleHook(PluginRecord):
    """``hook(args, sample, *, rollout_id=None, evaluation=False) -> Sample | None`` (sync or async): applied
    to every generated sample before its reward, in the order named (slime's ``--rollout-sample-hook-path``,
    repeatable). None keeps the sample as it is."""

    kind: ClassVar[str] = "sample_hook"
    call_args: ClassVar[tuple[str, ...]] = ("args", "sample")


@dataclass
class RolloutSampleFilter(PluginRecord):
    """``sample_filter(args, groups) -> None``: marks samples of a step's kept groups ``remove_sample = True``
    to leave them out of the loss (they still count in the group's reward normalization) (slime's
    ``--rollout-sample-filter-path``)."""

    kind: ClassVar[str] = "rollout_sample_filter"
    call_args: ClassVar[tuple[str, ...]] = ("args", "groups")


@dataclass
class AllSamplesProcess(PluginRecord):
    """``process(args, all_groups, data_source) -> None``: sees every group a step finished, kept and dropped
    alike, in group order (slime's ``--rollout-all-samples-process-path``)."""

    kind: ClassVar[str] = "all_samples_process"
    hook: ClassVar[str] = "rlsdk_all_samples_processes"
    call_args: ClassVar[tuple[str, ...]] = ("args", "all_groups", "data_source")


@dataclass
class Advantage(PluginRecord):
    """``advantage(args, rollout_data) -> None``: sets ``rollout_data["advantages"]`` (one per-token tensor per
    sample) in place of the built-in estimators (slime's ``--custom-advantage-function-path``)."""

    kind: ClassVar[str] = "advantage"
    call_args: ClassVar[tuple[str, ...]] = ("args", "rollout_data")


@dataclass
class RewardPostProcess(PluginRecord):
    """``post_process(args, samples) -> (raw_rewards, rewards)``: the rewards the trainer turns into advantages,
    in place of the group normalization (slime's ``--custom-reward-post-process-path``)."""

    kind: ClassVar[str] = "reward_post_process"
    hook: ClassVar[str] = "rlsdk_reward_post_processes"
    call_args: ClassVar[tuple[str, ...]] = ("args", "samples")


@dataclass
class RolloutDataPostprocess(PluginRecord):
    """``postprocess(args, rollout_id, rollout_data) -> None``: edits the training data once log-probs are in it
    (loss masks, say) (slime's ``--rollout-data-postprocess-path``)."""

    kind: ClassVar[str] = "rollout_data_postprocess"
    hook: ClassVar[str] = "rlsdk_rollout_data_postprocesses"
    call_args: ClassVar[tuple[str, ...]] = ("args", "rollout_id", "rollout_data")


@dataclass
class ConvertSamplesToTrainData(PluginRecord):
    """``convert(args, samples) -> dict``: slime's training-data dict from a step's samples (``tokens``,
    ``response_lengths``, ``rewards``, ``raw_reward``, ``truncated``, ``sample_indices``, ``loss_masks``)
    (slime's ``--custom-convert-samples-to-train-data-path``)."""

    kind: ClassVar[str] = "convert_samples_to_train_data"
    hook: ClassVar[str] = "rlsdk_train_data_converters"
    call_args: ClassVar[tuple[str, ...]] = ("args", "samples")


@dataclass
class RolloutLog(PluginRecord):
    """``log(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> bool``: a logging backend for
    each step (slime's ``--custom-rollout-log-function-path``); ``rollout_extra_metrics`` holds the step's
    metrics. True skips the default logging, as in slime."""

    kind: ClassVar[str] = "rollout_log"
    call_args: ClassVar[tuple[str, ...]] = (
        "rollout_id",
        "args",
        "samples",
        "rollout_extra_metrics",
        "rollout_time",
    )


@dataclass
class EvalRolloutLog(PluginRecord):
    """``log(rollout_id, args, data, extra_metrics) -> bool``: a logging backend for each eval (slime's
    ``--custom-eval-rollout-log-function-path``); ``data`` is the eval output's ``{dataset: {"rewards",
    "truncated", "samples"}}``."""

    kind: ClassVar[str] = "eval_rollout_log"
    call_args: ClassVar[tuple[str, ...]] = ("rollout_id", "args", "data", "extra_metrics")


@dataclass
class CheckpointCallback(PluginRecord):
    """``callback(args, rollout_id, path) -> None``: called after each checkpoint is complete (renamed into
    place, the run's state pointing at it), as verl's ``checkpoint_callback_class``."""

    kind: ClassVar[str] = "checkpoint_callback"
    call_args: ClassVar[tuple[str, ...]] = ("args", "rollout_id", "path")


@dataclass
class DataSourceFactory(PluginRecord):
    """``data_source(args) -> source``: a class or factory of the object serving a run's groups, with slime's
    methods ``get_samples(num_samples)``, ``add_samples(groups)`` (and rlsdk's ``state_dict()`` /
    ``load_state_dict()`` to resume) (slime's ``--data-source-path``)."""

    kind: ClassVar[str] = "data_source"
    call_args: ClassVar[tuple[str, ...]] = ("args",)


@dataclass
class PgLossReducer(PluginRecord):
    """``reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss) -> reduce``: the
    function that reduces the per-token policy-gradient loss (only that; the other metrics keep
    ``sum_of_sample_mean``) (slime's ``--custom-pg-loss-reducer-function-path``)."""

    kind: ClassVar[str] = "pg_loss_reducer"
    call_args: ClassVar[tuple[str, ...]] = (
        "total_lengths",
        "response_lengths",
        "loss_masks",
        "calculate_per_token_loss",
    )


TIS_ARGUMENTS = (
    "args",
    "pg_loss",
    "train_log_probs",
    "rollout_log_probs",
    "loss_masks",
    "total_lengths",
    "response_lengths",
)


@dataclass
class TisFunction(PluginRecord):
    """``tis(*, args, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths,
    response_lengths) -> (pg_loss, loss_masks, metrics)``: truncated importance sampling (or rejection) of the
    per-token policy-gradient loss with ``--use-tis`` (slime's ``--custom-tis-function-path``), called by
    keyword as slime calls it."""

    kind: ClassVar[str] = "tis_function"
    call_keywords: ClassVar[tuple[str, ...]] = TIS_ARGUMENTS


# ----- the trainer's and the weight sync's hooks (slime's megatron backend) ---------------------------------


@dataclass
class MegatronInit(PluginRecord):
    """``init(args) -> None``: called once on every trainer rank after megatron's parallel state is set up,
    before the model is built (slime's ``--custom-megatron-init-path``)."""

    kind: ClassVar[str] = "megatron_init"
    call_args: ClassVar[tuple[str, ...]] = ("args",)


@dataclass
class MegatronBeforeLogProb(PluginRecord):
    """``hook(args, model, store_prefix) -> None``: called before each log-prob computation of the megatron
    trainer, ``model`` its list of model chunks, ``store_prefix`` ``""`` (the policy) or ``"ref_"`` (the
    reference model) (slime's ``--custom-megatron-before-log-prob-hook-path``)."""

    kind: ClassVar[str] = "megatron_before_log_prob"
    call_args: ClassVar[tuple[str, ...]] = ("args", "model", "store_prefix")


@dataclass
class MegatronBeforeTrainStep(PluginRecord):
    """``hook(args, rollout_id, step_id, model, optimizer, opt_param_scheduler) -> None``: called before each
    optimizer step's forward and backward passes of the megatron trainer, the gradients zeroed
    (slime's ``--custom-megatron-before-train-step-hook-path``); rlsdk has no LR scheduler: ``None``."""

    kind: ClassVar[str] = "megatron_before_train_step"
    call_args: ClassVar[tuple[str, ...]] = (
        "args",
        "rollout_id",
        "step_id",
        "model",
        "optimizer",
        "opt_param_scheduler",
    )


@dataclass
class ModelProvider(PluginRecord):
    """``provider(pre_process, post_process, vp_stage=None) -> GPTModel``: builds the megatron trainer's model
    in place of its own ``GPTModel`` (slime's ``--custom-model-provider-path``), called by keyword; the
    converted Hugging Face weights are then loaded into it, so its weights must keep ``GPTModel``'s names.
    ``vp_stage``, and rlsdk's ``config`` (the ``TransformerConfig`` the trainer would use) and
    ``model_kwargs`` (its other ``GPTModel`` arguments), are passed where the provider declares them."""

    kind: ClassVar[str] = "model_provider"
    call_keywords: ClassVar[tuple[str, ...]] = ("pre_process", "post_process")


@dataclass
class UpdateWeightPostWrite(PluginRecord):
    """``hook(args, version_dir, rollout_engines) -> None``: called after a disk weight sync wrote a version's
    files into ``version_dir`` and before the engines read them (to publish them on a filesystem without
    cross-host consistency, say) (slime's ``--custom-update-weight-post-write-path``)."""

    kind: ClassVar[str] = "update_weight_post_write"
    call_args: ClassVar[tuple[str, ...]] = ("args", "version_dir", "rollout_engines")


@dataclass
class Environment(PluginRecord):
    """An environment: everything one task needs, shipped as one package. ``func`` is ``settings() -> dict``:
    the run options it sets, any of ``rlsdk run``'s (``prompt_data``, ``label_key``, ``input_key``,
    ``apply_chat_template``, ``rm_type`` (a reward, or a rubric ``"a:0.7,b:0.3"``),
    ``custom_generate_function_path``, ``agent_function_path``, ``eval_datasets``, ``num_rollout``, ...); an
    option given on the command line wins over it. Data files inside the package are found with
    :func:`rlsdk.package_file`; tools are named by the settings (``tools`` in its rows, or its agent's)."""

    kind: ClassVar[str] = "environment"
    call_args: ClassVar[tuple[str, ...]] = ()
    train_settings: dict[str, Any] = field(default_factory=dict)
    """Options that apply only with ``--train`` (steps, batch sizes, learning rate), under the same rule."""


OPTION_TYPES: tuple[type, ...] = (str, int, float, bool, list, dict)
TYPE_NAMES = {
    int: "an integer",
    float: "a number",
    str: "a string",
    bool: "true or false",
    list: "a list",
    dict: "a mapping",
}
"""How an option's type is named in its error message."""


@dataclass
class Option:
    """A run option a plugin reads from ``args`` (``args.<name>``): declared so that ``rlsdk run --help`` and
    ``rlsdk plugins show`` list it and a value of the wrong type, or a misspelled key, is an error.

    ``type`` is ``str``, ``int``, ``float``, ``bool``, ``list`` or ``dict``; ``default`` is what
    ``args.<name>`` reads when the run does not set it (None: unset); ``choices`` limits the values."""

    name: str
    type: type
    default: Any = None
    help: str = ""
    choices: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip().isidentifier():
            raise ValueError(f"an option name must be an identifier, got {self.name!r}")
        self.name = normalize_name(self.name)
        if self.type not in OPTION_TYPES:
            raise TypeError(
                f"option {self.name!r}: type must be one of "
                f"{', '.join(t.__name__ for t in OPTION_TYPES)}, got {self.type!r}"
            )
        if self.default is not None:
            self.default = self.check(self.default)

    def check(self, value: Any) -> Any:
        """``value`` as this option's type (an int for a float option becomes a float); ValueError when it is
        not one, or not one of ``choices``."""
        if value is None:
            return None
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif self.type is list and isinstance(value, str):  # one item, as --set key=item gives it
            value = [value]
        elif self.type is str and isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, self.type) or (self.type is int and isinstance(value, bool)):
            kind = TYPE_NAMES.get(self.type, f"a {self.type.__name__}")
            raise ValueError(f"option {self.name!r} takes {kind}, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise ValueError(
                f"option {self.name!r} must be one of {', '.join(map(str, self.choices))}, got {value!r}"
            )
        return value


RECORD_TYPES: dict[str, type[PluginRecord]] = {
    cls.kind: cls
    for cls in (
        GenerateRollout,
        CustomGenerate,
        Reward,
        DynamicFilter,
        OverSamplingFilter,
        BufferFilter,
        Engine,
        Tool,
        TaskGenerator,
        Trainer,
        Loss,
        ToolCallParser,
        Agent,
        SampleHook,
        RolloutSampleFilter,
        AllSamplesProcess,
        Advantage,
        RewardPostProcess,
        RolloutDataPostprocess,
        ConvertSamplesToTrainData,
        RolloutLog,
        EvalRolloutLog,
        CheckpointCallback,
        DataSourceFactory,
        PgLossReducer,
        TisFunction,
        Environment,
        MegatronInit,
        MegatronBeforeLogProb,
        MegatronBeforeTrainStep,
        ModelProvider,
        UpdateWeightPostWrite,
    )
}
"""Kind name -> record type. The hook for kind ``k`` is ``rlsdk_<k>s`` (``rlsdk_losses`` for ``loss``)."""

KINDS: tuple[str, ...] = tuple(RECORD_TYPES)


def hook_name(kind: str) -> str:
    return RECORD_TYPES[kind].hook or f"rlsdk_{kind}s"


@dataclass(frozen=True)
class PluginInfo:
    """Where a record came from: the entry point and distribution that registered it."""

    plugin: str
    distribution: str | None = None
    version: str | None = None
    module: str | None = None

    def describe(self) -> str:
        if self.distribution:
            return f"{self.distribution} {self.version or ''}".strip()
        return f"plugin {self.plugin!r}"


RecordT = TypeVar("RecordT", bound=PluginRecord)


@dataclass
class Resolved(Generic[RecordT]):
    """A record resolved by name or path, with its provenance and call facts checked once. Resolving by a kind's
    name gives ``Resolved[Any]``: the record's kind-specific fields (``group``, ``cheap``) are read as given."""

    record: RecordT
    info: PluginInfo
    is_async: bool = False
    accepts_evaluation: bool = False

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def kind(self) -> str:
        return self.record.kind

    @property
    def func(self) -> Callable[..., Any]:
        return self.record.func

    def describe(self) -> str:
        return f"{self.kind} {self.name!r} from {self.info.describe()}"
