"""The rollout's kinds, each declared once: its record (what a provider hook yields), its call as a typed
``Protocol``, the run options naming it, its default and when it is called. The hook, the resolution, the
call point, the testing kit's check, the scaffold, the slime adapter and the docs row are derived from these
declarations (:mod:`rlsdk.plugins.kinds`)."""

from __future__ import annotations

from argparse import Namespace

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from ...types import Sample
from ..loading import is_async_callable
from ..records import Option, PluginArgs, PluginRecord
from ...options import RunOptions


__all__ = [
    "AllSamplesProcess",
    "BufferFilter",
    "CustomGenerate",
    "DataSourceFactory",
    "DynamicFilter",
    "Engine",
    "Environment",
    "EvalRolloutLog",
    "GenerateRollout",
    "OverSamplingFilter",
    "Reward",
    "RolloutLog",
    "RolloutMetrics",
    "RolloutSampleFilter",
    "SampleHook",
]


class GenerateRolloutCall(Protocol):
    """``generate_rollout``'s call."""

    def __call__(self, args: PluginArgs, rollout_id: int, data_source: Any, /) -> Any: ...


@dataclass
class GenerateRollout(PluginRecord):
    """``generate_rollout(args, rollout_id, data_source, evaluation=False)``: one whole step.

    The hook provides whole rollout steps.

    The callable is ``generate_rollout(args, rollout_id, data_source, evaluation=False)`` and returns
    ``RolloutFnTrainOutput`` (or ``RolloutFnEvalOutput`` when ``evaluation``); a bare list of groups
    is wrapped, as slime does.

    - ``args``: the run's :class:`rlsdk.RolloutConfig`.
    - ``rollout_id``: the step number.
    - ``data_source``: the :class:`rlsdk.data.DataSource` serving groups of samples.

    **Example:**

    .. code-block:: python

        from rlsdk import GenerateRollout, RolloutFnTrainOutput, hookimpl

        def replay(args, rollout_id, data_source, evaluation=False):
            groups = data_source.get_samples(args.rollout_batch_size)
            return RolloutFnTrainOutput(samples=groups)

        @hookimpl
        def rlsdk_generate_rollouts():
            yield GenerateRollout(name="replay", func=replay, description="Serve groups unchanged")
    """

    kind: ClassVar[str] = "generate_rollout"
    slime: ClassVar[bool] = True
    call_args: ClassVar[tuple[str, ...]] = ("args", "rollout_id", "data_source")
    scope: ClassVar[str] = "step"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "rollout_function_path", str, "sglang", "The generate_rollout plugin: one training or eval step."
        ),
        Option(
            "eval_function_path",
            str,
            None,
            "The generate_rollout plugin for eval; defaults to `rollout_function_path`.",
        ),
    )
    func: GenerateRolloutCall
    chat_messages: bool = False
    """The rollout takes chat-message prompts as messages (it applies the chat template itself, as ``sft``
    does): without ``apply_chat_template`` the data source keeps them instead of refusing them."""


class CustomGenerateCall(Protocol):
    """``custom_generate``'s call."""

    def __call__(self, args: PluginArgs, sample: Sample, sampling_params: dict[str, Any], /) -> Any: ...


@dataclass
class CustomGenerate(PluginRecord):
    """``async custom_generate(args, sample, sampling_params[, evaluation])``: one sample's response.

    The hook provides generators that turn one sample into a response (single-turn, multi-turn, agents).

    The callable is ``async custom_generate(args, sample, sampling_params[, evaluation])`` and returns
    the sample (or a list of samples) with ``tokens``, ``response``, ``response_length``,
    ``rollout_log_probs``, ``loss_mask`` and ``status`` filled. ``evaluation`` is passed only when the
    function declares it.

    - ``args``: the run's :class:`rlsdk.RolloutConfig`; ``args.sglang_router_ip`` and
        ``args.sglang_router_port`` address the engine's ``/generate``.
    - ``sample``: the :class:`rlsdk.Sample` to complete.
    - ``sampling_params``: SGLang sampling parameters for this sample.

    **Example:**

    .. code-block:: python

        from rlsdk import CustomGenerate, hookimpl, single_turn

        async def twice(args, sample, sampling_params):
            sample = await single_turn(args, sample, sampling_params)
            sample.metadata["attempts"] = 1
            return sample

        @hookimpl
        def rlsdk_custom_generates():
            yield CustomGenerate(name="twice", func=twice, description="Single turn, tagged")
    """

    kind: ClassVar[str] = "custom_generate"
    slime: ClassVar[bool] = True
    call_args: ClassVar[tuple[str, ...]] = ("args", "sample", "sampling_params")
    scope: ClassVar[str] = "sample"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "custom_generate_function_path",
            str,
            None,
            "The custom_generate plugin that turns one sample into a response; default single-turn generate.",
        ),
    )
    func: CustomGenerateCall
    default: ClassVar[str | None] = "single_turn"
    multi_turn: bool = False
    """The generator runs several model turns a sample (tool calls, an agent, an environment's replies):
    a run in which every sample got one model turn is a silent fallback, and its detector warns."""


class RewardCall(Protocol):
    """``reward``'s call."""

    def __call__(self, args: PluginArgs, sample: Sample, /) -> Any: ...


class GroupRewardCall(Protocol):
    """A group ``reward``'s call (``group=True``)."""

    def __call__(self, args: PluginArgs, samples: list[Sample], /) -> Any: ...


@dataclass
class Reward(PluginRecord):
    """``async reward(args, sample, **kwargs)``; with ``group=True``, ``reward(args, samples)`` returns a list of
    rewards, one per sample.

    The hook provides reward functions.

    The callable is ``reward(args, sample, **kwargs) -> float | dict | None`` (sync or async). With
    ``group=True`` it is ``reward(args, samples, **kwargs) -> list`` and is called once per group.
    ``None`` marks the sample's reward invalid; it is never read as 0.

    - ``args``: the run's :class:`rlsdk.RolloutConfig`.
    - ``sample``: the :class:`rlsdk.Sample` to score (``samples`` for group rewards).

    **Example:**

    .. code-block:: python

        from rlsdk import Reward, hookimpl

        def exact(args, sample, **kwargs):
            return float(sample.response.strip() == str(sample.label).strip())

        @hookimpl
        def rlsdk_rewards():
            yield Reward(name="exact", func=exact, description="1 if the response equals the label")
    """

    kind: ClassVar[str] = "reward"
    slime: ClassVar[bool] = True
    call_args: ClassVar[tuple[str, ...]] = ("args", "sample")
    scope: ClassVar[str] = "sample"
    options: ClassVar[tuple[Option, ...]] = (
        Option("rm_type", str, "math", 'The reward plugin; a sample\'s `metadata["rm_type"]` overrides it.'),
        Option(
            "custom_rm_path",
            str,
            None,
            "A reward by dotted path that takes precedence over `rm_type` (slime's `--custom-rm-path`).",
        ),
    )
    func: RewardCall | GroupRewardCall

    @classmethod
    def chosen(cls, args: RunOptions | Namespace) -> Any:
        """``custom_rm_path`` (slime's, before ``rm_type``), else ``rm_type``."""
        return getattr(args, "custom_rm_path", None) or getattr(args, "rm_type", None)

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


class DynamicFilterCall(Protocol):
    """``dynamic_filter``'s call."""

    def __call__(self, args: PluginArgs, samples: list[Sample], /) -> Any: ...


@dataclass
class DynamicFilter(PluginRecord):
    """``dynamic_filter(args, samples, **kwargs) -> DynamicFilterOutput | bool`` for one finished group.

    The hook provides dynamic filters, applied to each finished group during a step.

    The callable is ``dynamic_filter(args, samples, **kwargs) -> DynamicFilterOutput | bool``; a
    dropped group counts under its ``reason`` in the step's metrics.

    - ``args``: the run's :class:`rlsdk.RolloutConfig`.
    - ``samples``: one group, all samples of one prompt, rewarded.

    **Example:**

    .. code-block:: python

        from rlsdk import DynamicFilter, DynamicFilterOutput, hookimpl

        def any_correct(args, samples, **kwargs):
            ok = any(s.get_reward_value(args) for s in samples)
            return DynamicFilterOutput(keep=ok, reason=None if ok else "all_wrong")

        @hookimpl
        def rlsdk_dynamic_filters():
            yield DynamicFilter(name="any_correct", func=any_correct)
    """

    kind: ClassVar[str] = "dynamic_filter"
    slime: ClassVar[bool] = True
    call_args: ClassVar[tuple[str, ...]] = ("args", "samples")
    scope: ClassVar[str] = "group"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "dynamic_sampling_filter_path",
            str,
            None,
            "The dynamic_filter plugin applied to each finished group; none keeps every group.",
        ),
    )
    func: DynamicFilterCall


class OverSamplingFilterCall(Protocol):
    """``over_sampling_filter``'s call."""

    def __call__(self, args: PluginArgs, groups: list[list[Sample]], /) -> Any: ...


@dataclass
class OverSamplingFilter(PluginRecord):
    """``over_sampling_filter(args, groups, **kwargs) -> groups``: order the kept groups before the cut.

    The hook provides over-sampling filters, which order the kept groups before the batch is cut.

    The callable is ``over_sampling_filter(args, groups, **kwargs) -> groups``; the loop keeps the
    first ``rollout_batch_size`` groups of the result and returns the rest to the buffer.

    - ``args``: the run's :class:`rlsdk.RolloutConfig`.
    - ``groups``: the kept groups.

    **Example:**

    .. code-block:: python

        from rlsdk import OverSamplingFilter, hookimpl

        def longest_first(args, groups, **kwargs):
            return sorted(groups, key=lambda g: -sum(s.response_length for s in g))

        @hookimpl
        def rlsdk_over_sampling_filters():
            yield OverSamplingFilter(name="longest_first", func=longest_first)
    """

    kind: ClassVar[str] = "over_sampling_filter"
    slime: ClassVar[bool] = True
    call_args: ClassVar[tuple[str, ...]] = ("args", "groups")
    scope: ClassVar[str] = "step"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "over_sampling_filter_path",
            str,
            None,
            "The over_sampling_filter plugin that orders kept groups before the batch is cut.",
        ),
    )
    func: OverSamplingFilterCall


class BufferFilterCall(Protocol):
    """``buffer_filter``'s call."""

    def __call__(
        self, args: PluginArgs, rollout_id: int, buffer: list[list[Sample]], num_samples: int, /
    ) -> Any: ...


@dataclass
class BufferFilter(PluginRecord):
    """``buffer_filter(args, rollout_id, buffer, num_samples) -> groups``, removing them from ``buffer``.

    The hook provides buffer filters, which choose the buffered groups served before fresh data.

    The callable is ``buffer_filter(args, rollout_id, buffer, num_samples) -> groups``: it returns at
    most ``num_samples`` groups and removes them from ``buffer`` (a list it may mutate).

    - ``args``: the run's :class:`rlsdk.RolloutConfig`.
    - ``rollout_id``: the current step.
    - ``buffer``: the buffered groups, oldest first.
    - ``num_samples``: how many groups are wanted.

    **Example:**

    .. code-block:: python

        from rlsdk import BufferFilter, hookimpl

        def newest_first(args, rollout_id, buffer, num_samples):
            taken = buffer[-num_samples:] if num_samples else []
            del buffer[len(buffer) - len(taken):]
            return taken[::-1]

        @hookimpl
        def rlsdk_buffer_filters():
            yield BufferFilter(name="newest_first", func=newest_first)
    """

    kind: ClassVar[str] = "buffer_filter"
    slime: ClassVar[bool] = True
    call_args: ClassVar[tuple[str, ...]] = ("args", "rollout_id", "buffer", "num_samples")
    scope: ClassVar[str] = "step"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "buffer_filter_path",
            str,
            "pop_first",
            "The buffer_filter plugin that chooses which buffered groups are served first.",
        ),
    )
    func: BufferFilterCall
    default: ClassVar[str | None] = "pop_first"


class EngineCall(Protocol):
    """``engine``'s call."""

    def __call__(self, args: PluginArgs, /) -> Any: ...


@dataclass
class Engine(PluginRecord):
    """``engine(args) -> rlsdk.engines.engine.InferenceEngine``: a factory for an engine speaking SGLang's
    protocol.

    The hook provides inference engines speaking SGLang's native protocol.

    The callable is a factory ``engine(args) -> rlsdk.engines.engine.InferenceEngine``; it may set
    ``args.sglang_router_ip``/``args.sglang_router_port`` when the engine serves HTTP.

    - ``args``: the run's :class:`rlsdk.RolloutConfig`.

    **Example:**

    .. code-block:: python

        from rlsdk import Engine, hookimpl
        from rlsdk.engine_api import SGLangClient

        def my_cluster(args):
            return SGLangClient("http://10.0.0.5:30000")

        @hookimpl
        def rlsdk_engines():
            yield Engine(name="my_cluster", func=my_cluster, description="Our shared SGLang router")
    """

    kind: ClassVar[str] = "engine"
    call_args: ClassVar[tuple[str, ...]] = ("args",)
    scope: ClassVar[str] = "run"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "engine",
            str,
            "embedded",
            "The engine: `embedded`, `sglang`, another engine plugin, or an SGLang server/router URL.",
        ),
    )
    func: EngineCall
    check: Callable[[Any], None] | None = None
    """``check(args)``: raises on settings this engine cannot serve, with a one-line reason; ``rlsdk run``
    calls it before anything starts."""
    launches: Callable[[Any], bool] | None = None
    """``launches(args)``: whether the engine starts servers of its own on GPUs for these settings. On Ray
    each engine actor then asks for ``rollout_num_gpus_per_engine`` GPUs and launches one engine on them, and
    the pool keeps no standby (it would hold GPUs)."""

    @classmethod
    def chosen(cls, args: RunOptions | Namespace) -> Any:
        """``--engine URL`` names the ``sglang`` engine, which reads the URL from ``args.engine``."""
        name = getattr(args, "engine", None) or ""
        return "sglang" if name.startswith(("http://", "https://")) else name


class SampleHookCall(Protocol):
    """``sample_hook``'s call."""

    def __call__(self, args: PluginArgs, sample: Sample, /) -> Any: ...


@dataclass
class SampleHook(PluginRecord):
    """``hook(args, sample, *, rollout_id=None, evaluation=False) -> Sample | None`` (sync or async): applied to
    every generated sample before its reward, in the order named (slime's ``--rollout-sample-hook-path``,
    repeatable). None keeps the sample as it is.

    The hook provides sample hooks, applied to every generated sample before its reward (``--sample-hook NAME``,
    slime's ``--rollout-sample-hook-path``; several run in the order given).

    The callable is ``hook(args, sample, *, rollout_id=None, evaluation=False) -> Sample | None`` (sync or
    async); ``rollout_id`` and ``evaluation`` are passed only when it declares them. It returns the sample
    to go on with, or None to keep the one it was given (edited in place, say).

    - ``args``: the run's :class:`rlsdk.RolloutConfig`.
    - ``sample``: one finished :class:`rlsdk.Sample`.

    **Example:**

    .. code-block:: python

        from rlsdk import SampleHook, hookimpl

        def strip_think(args, sample, *, rollout_id=None, evaluation=False):
            sample.response = sample.response.split("</think>")[-1]

        @hookimpl
        def rlsdk_sample_hooks():
            yield SampleHook(name="strip_think", func=strip_think, description="Grade the text after </think>")
    """

    kind: ClassVar[str] = "sample_hook"
    slime: ClassVar[bool] = True
    call_args: ClassVar[tuple[str, ...]] = ("args", "sample")
    scope: ClassVar[str] = "sample"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "rollout_sample_hook_path",
            list,
            [],
            "sample_hook plugins applied, in order, to every generated sample before its reward.",
        ),
    )
    many: ClassVar[bool] = True
    func: SampleHookCall


class RolloutSampleFilterCall(Protocol):
    """``rollout_sample_filter``'s call."""

    def __call__(self, args: PluginArgs, groups: list[list[Sample]], /) -> Any: ...


@dataclass
class RolloutSampleFilter(PluginRecord):
    """``sample_filter(args, groups) -> None``: marks samples of a step's kept groups ``remove_sample = True`` to
    leave them out of the loss (they still count in the group's reward normalization) (slime's ``--rollout-
    sample-filter-path``).

    The hook provides sample filters, applied to a step's kept groups (``--rollout-sample-filter-path NAME``).

    The callable is slime's ``sample_filter(args, groups) -> None``: it sets ``remove_sample = True`` on the
    samples to leave out of the loss (their loss mask becomes 0; they still count in their group's reward
    normalization).

    - ``args``: the run's :class:`rlsdk.RolloutConfig`.
    - ``groups``: the step's kept groups.

    **Example:**

    .. code-block:: python

        from rlsdk import RolloutSampleFilter, hookimpl

        def drop_truncated(args, groups):
            for group in groups:
                for sample in group:
                    sample.remove_sample = sample.status == sample.Status.TRUNCATED

        @hookimpl
        def rlsdk_rollout_sample_filters():
            yield RolloutSampleFilter(name="drop_truncated", func=drop_truncated)
    """

    kind: ClassVar[str] = "rollout_sample_filter"
    slime: ClassVar[bool] = True
    call_args: ClassVar[tuple[str, ...]] = ("args", "groups")
    scope: ClassVar[str] = "step"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "rollout_sample_filter_path",
            str,
            None,
            "A rollout_sample_filter plugin that marks kept samples `remove_sample` (out of the loss).",
        ),
    )
    func: RolloutSampleFilterCall


class AllSamplesProcessCall(Protocol):
    """``all_samples_process``'s call."""

    def __call__(self, args: PluginArgs, all_groups: list[list[Sample]], data_source: Any, /) -> Any: ...


@dataclass
class AllSamplesProcess(PluginRecord):
    """``process(args, all_groups, data_source) -> None``: sees every group a step finished, kept and dropped
    alike, in group order (slime's ``--rollout-all-samples-process-path``).

    The hook provides processors of every group a step finished, kept and dropped alike
    (``--rollout-all-samples-process-path NAME``), called once at the end of each step.

    The callable is slime's ``process(args, all_groups, data_source) -> None``.

    - ``args``: the run's :class:`rlsdk.RolloutConfig`.
    - ``all_groups``: the step's kept and discarded groups, by group index.
    - ``data_source``: the run's data source.

    **Example:**

    .. code-block:: python

        import json
        from rlsdk import AllSamplesProcess, hookimpl

        def dump_all(args, all_groups, data_source):
            with open(f"{args.output_dir}/all_groups.jsonl", "a") as out:
                for group in all_groups:
                    out.write(json.dumps([s.reward for s in group], default=str) + "\\n")

        @hookimpl
        def rlsdk_all_samples_processes():
            yield AllSamplesProcess(name="dump_all", func=dump_all)
    """

    kind: ClassVar[str] = "all_samples_process"
    slime: ClassVar[bool] = True
    hook: ClassVar[str] = "rlsdk_all_samples_processes"
    call_args: ClassVar[tuple[str, ...]] = ("args", "all_groups", "data_source")
    scope: ClassVar[str] = "step"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "rollout_all_samples_process_path",
            str,
            None,
            "An all_samples_process plugin that sees every group a step finished, kept and dropped.",
        ),
    )
    func: AllSamplesProcessCall


class RolloutMetricsCall(Protocol):
    """``rollout_metrics``'s call."""

    def __call__(self, args: PluginArgs, rollout_id: int, samples: list[Sample], /) -> Any: ...


@dataclass
class RolloutMetrics(PluginRecord):
    """``metrics(args, rollout_id, samples) -> dict[str, float]``: metrics of one step, computed from the samples
    it trains on (its kept groups), written with the step's own as ``custom/<name>`` (in ``metrics.jsonl``,
    the step table and every logging backend).

    The hook provides step metrics of a task's own: how often an answer was boxed, the mean number of tool
    calls, a length a task cares about (``--rollout-metrics a,b``; several, in order).

    - ``args``: the run's :class:`rlsdk.RolloutConfig`.
    - ``rollout_id``: the step number.
    - ``samples``: the samples of the step's kept groups, in group order.

    **Example:**

    .. code-block:: python

        from rlsdk import RolloutMetrics, hookimpl

        def boxed_share(args, rollout_id, samples):
            boxed = sum("\\\\boxed{" in (s.response or "") for s in samples)
            return {"boxed_share": boxed / len(samples) if samples else 0.0}

        @hookimpl
        def rlsdk_rollout_metrics():
            yield RolloutMetrics(name="boxed_share", func=boxed_share)
    """

    kind: ClassVar[str] = "rollout_metrics"
    hook: ClassVar[str] = "rlsdk_rollout_metrics"
    call_args: ClassVar[tuple[str, ...]] = ("args", "rollout_id", "samples")
    scope: ClassVar[str] = "step"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "rollout_metrics", list, [], "rollout_metrics plugins whose metrics each step adds, in order."
        ),
    )
    many: ClassVar[bool] = True
    func: RolloutMetricsCall

    @classmethod
    def result_problem(cls, result: Any) -> str | None:
        """A dict of metric names to finite numbers."""
        if not isinstance(result, dict) or not all(isinstance(key, str) for key in result):
            return f"returned {type(result).__name__} {repr(result)[:80]}: expected a dict of metric names to numbers"
        bad = {
            key: value
            for key, value in result.items()
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
        }
        return f"returned metrics that are not finite numbers: {repr(bad)[:120]}" if bad else None


class RolloutLogCall(Protocol):
    """``rollout_log``'s call."""

    def __call__(
        self,
        rollout_id: int,
        args: PluginArgs,
        samples: list[Sample],
        rollout_extra_metrics: dict[str, Any],
        rollout_time: float,
        /,
    ) -> Any: ...


@dataclass
class RolloutLog(PluginRecord):
    """``log(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> bool``: a logging backend for
    each step (slime's ``--custom-rollout-log-function-path``); ``rollout_extra_metrics`` holds the step's
    metrics. True skips the default logging, as in slime.

    The hook provides logging backends for each step (``--rollout-log a,b``, slime's
    ``--custom-rollout-log-function-path``; ``jsonl``, ``tensorboard`` and ``wandb`` ship with core).

    The callable is ``log(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> bool``.

    - ``rollout_id``: the step.
    - ``args``: the run's :class:`rlsdk.RolloutConfig` (``args.output_dir`` is the run's folder).
    - ``samples``: the step's kept samples, flat.
    - ``rollout_extra_metrics``: the step's metrics (``rollout/...``, ``train/...``).
    - ``rollout_time``: the step's rollout seconds.

    **Example:**

    .. code-block:: python

        from rlsdk import RolloutLog, hookimpl

        def print_reward(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
            print(rollout_id, rollout_extra_metrics.get("rollout/reward_mean"))
            return False

        @hookimpl
        def rlsdk_rollout_logs():
            yield RolloutLog(name="print_reward", func=print_reward)
    """

    kind: ClassVar[str] = "rollout_log"
    slime: ClassVar[bool] = True
    call_args: ClassVar[tuple[str, ...]] = (
        "rollout_id",
        "args",
        "samples",
        "rollout_extra_metrics",
        "rollout_time",
    )
    scope: ClassVar[str] = "step"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "custom_rollout_log_function_path",
            str,
            None,
            "rollout_log plugins (`jsonl`, `tensorboard`, `wandb`, ...; several joined by commas) that log every step beside `metrics.jsonl`.",
        ),
    )
    many: ClassVar[bool] = True
    func: RolloutLogCall


class EvalRolloutLogCall(Protocol):
    """``eval_rollout_log``'s call."""

    def __call__(
        self, rollout_id: int, args: PluginArgs, data: Any, extra_metrics: dict[str, Any], /
    ) -> Any: ...


@dataclass
class EvalRolloutLog(PluginRecord):
    """``log(rollout_id, args, data, extra_metrics) -> bool``: a logging backend for each eval (slime's
    ``--custom-eval-rollout-log-function-path``); ``data`` is the eval output's ``{dataset: {"rewards",
    "truncated", "samples"}}``.

    The hook provides logging backends for each eval (``--eval-rollout-log a,b``, slime's
    ``--custom-eval-rollout-log-function-path``).

    The callable is ``log(rollout_id, args, data, extra_metrics) -> bool``.

    - ``rollout_id``: the step the eval follows (-1 before the first).
    - ``args``: the run's :class:`rlsdk.RolloutConfig`.
    - ``data``: ``{dataset: {"rewards", "truncated", "samples"}}``.
    - ``extra_metrics``: the eval's metrics (``eval/<dataset>/...``).

    **Example:**

    .. code-block:: python

        from rlsdk import EvalRolloutLog, hookimpl

        def print_eval(rollout_id, args, data, extra_metrics):
            for name, part in data.items():
                print(rollout_id, name, sum(r or 0 for r in part["rewards"]) / len(part["rewards"]))
            return False

        @hookimpl
        def rlsdk_eval_rollout_logs():
            yield EvalRolloutLog(name="print_eval", func=print_eval)
    """

    kind: ClassVar[str] = "eval_rollout_log"
    slime: ClassVar[bool] = True
    call_args: ClassVar[tuple[str, ...]] = ("rollout_id", "args", "data", "extra_metrics")
    scope: ClassVar[str] = "eval"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "custom_eval_rollout_log_function_path",
            str,
            None,
            "eval_rollout_log plugins (several joined by commas) that log every eval.",
        ),
    )
    many: ClassVar[bool] = True
    func: EvalRolloutLogCall


class DataSourceFactoryCall(Protocol):
    """``data_source``'s call."""

    def __call__(self, args: PluginArgs, /) -> Any: ...


@dataclass
class DataSourceFactory(PluginRecord):
    """``data_source(args) -> source``: a class or factory of the object serving a run's groups, with slime's
    methods ``get_samples(num_samples)``, ``add_samples(groups)`` (and rlsdk's ``state_dict()`` /
    ``load_state_dict()`` to resume) (slime's ``--data-source-path``).

    The hook provides data sources, the objects that serve a run's groups (``--data-source NAME``, slime's
    ``--data-source-path``).

    The callable is a class or factory ``data_source(args)`` whose result has slime's methods
    ``get_samples(num_samples) -> list[list[Sample]]`` and ``add_samples(groups)``; with ``state_dict()`` and
    ``load_state_dict(state)`` a run resumes where it stopped.

    Each ``Sample`` carries its ``prompt`` as the text the model continues: a custom source renders the chat
    template itself (``--apply-chat-template`` applies only to core's ``prompt_data``; a list of messages is
    refused when generating), for instance with
    ``get_runtime(args).tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``,
    or gives the prompt's ``tokens``. ``label`` and ``metadata`` are what the rewards read; ``group_index``
    and ``index`` number the groups and samples (a group is ``n_samples_per_prompt`` samples of one prompt).

    - ``args``: the run's :class:`rlsdk.RolloutConfig`.

    **Example:**

    .. code-block:: python

        from rlsdk import DataSourceFactory, Sample, hookimpl

        class Countdown:
            def __init__(self, args):
                self.args, self.next = args, 0
                self.buffer = []

            def get_samples(self, num_samples, rollout_id=None):
                groups = []
                for _ in range(num_samples):
                    self.next += 1
                    prompt = f"What is {self.next} + 1?"
                    groups.append([Sample(prompt=prompt, label=str(self.next + 1), group_index=self.next)
                                   for _ in range(self.args.n_samples_per_prompt)])
                return groups

            def add_samples(self, groups, rollout_id=None):
                self.buffer.extend(groups)

        @hookimpl
        def rlsdk_data_sources():
            yield DataSourceFactory(name="countdown", func=Countdown, description="Endless additions")
    """

    kind: ClassVar[str] = "data_source"
    slime: ClassVar[bool] = True
    call_args: ClassVar[tuple[str, ...]] = ("args",)
    scope: ClassVar[str] = "run"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "data_source_path",
            str,
            None,
            "A data_source plugin that serves the groups; default rlsdk's (`prompt_data`, buffer, resume).",
        ),
    )
    func: DataSourceFactoryCall


class EnvironmentCall(Protocol):
    """``environment``'s call."""

    def __call__(self) -> Any: ...


@dataclass
class Environment(PluginRecord):
    """An environment: everything one task needs, shipped as one package. ``func`` is ``settings() -> dict``: the
    run options it sets, any of ``rlsdk run``'s (``prompt_data``, ``label_key``, ``input_key``,
    ``apply_chat_template``, ``rm_type`` (a reward, or a rubric ``"a:0.7,b:0.3"``),
    ``custom_generate_function_path``, ``agent_function_path``, ``eval_datasets``, ``num_rollout``, ...); an
    option given on the command line wins over it. Data files inside the package are found with
    :func:`rlsdk.package_file`; tools are named by the settings (``tools`` in its rows, or its agent's).

    The hook provides environments: a task as one package (``rlsdk run --env NAME``, ``rlsdk eval --env NAME``).

    The callable is ``settings() -> dict``: the run options the environment sets (its dataset, label key
    and chat settings, its reward or rubric, its generator or agent, its eval sets, default options); an
    option on the command line wins over the environment's.

    **Example:**

    .. code-block:: python

        from rlsdk import Environment, hookimpl, package_file

        def settings():
            return {
                "prompt_data": package_file("my_env", "data/train.jsonl"),
                "label_key": "label",
                "apply_chat_template": True,
                "rm_type": "exact:0.8,has_number:0.2",
                "eval_datasets": [{"name": "held-out", "path": package_file("my_env", "data/eval.jsonl")}],
            }

        @hookimpl
        def rlsdk_environments():
            yield Environment(name="my_env", func=settings, description="Two-digit sums")
    """

    kind: ClassVar[str] = "environment"
    call_args: ClassVar[tuple[str, ...]] = ()
    scope: ClassVar[str] = "run"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "env",
            str,
            None,
            "An environment plugin whose settings (data, reward or rubric, generator, eval sets, options) the run takes; options given on the command line or in a config file win over them.",
        ),
    )
    func: EnvironmentCall
    train_settings: dict[str, Any] = field(default_factory=dict)
    """Options that apply only with ``--train`` (steps, batch sizes, learning rate), under the same rule."""
