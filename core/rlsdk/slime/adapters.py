"""Adapters from rlsdk's resolved plugins to slime's calling conventions (see :mod:`rlsdk.slime`).

slime awaits every custom reward, expects its own ``DynamicFilterOutput`` (anything else it wraps as a
truthy ``keep``), passes ``rollout_id=None`` to buffer filters, calls ``data_source.get_samples(n)``, and
checks ``isinstance`` against its own ``Sample``; its ``args`` lacks rlsdk's options. Each adapter
bridges exactly those differences and nothing else.
"""

from __future__ import annotations

from argparse import Namespace
import copy
import functools
import importlib
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from ..config import RolloutConfig, core_options, installed_options
from ..errors import PluginCallError, UnknownPluginError
from ..plugins.calls import (
    call_advantage,
    call_all_samples_process,
    call_convert_samples_to_train_data,
    call_data_source,
    call_eval_rollout_log,
    call_megatron_before_log_prob,
    call_megatron_before_train_step,
    call_megatron_init,
    call_model_provider,
    call_pg_loss_reducer,
    call_plugin,
    call_reward,
    call_reward_post_process,
    call_rollout_data_postprocess,
    call_rollout_log,
    call_rollout_sample_filter,
    call_sample_hooks,
    call_tis_function,
    call_update_weight_post_write,
)
from ..plugins.manager import RlsdkPluginManager, get_plugin_manager
from ..plugins.records import Resolved
from ..runtime import get_runtime
from ..types import DynamicFilterOutput, RolloutFnEvalOutput, RolloutFnTrainOutput, Sample


@functools.cache
def plugin_manager() -> RlsdkPluginManager:
    """The installed plugins, discovered once per process."""
    return get_plugin_manager()


def kind_module_hooks(kind: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module's ``__getattr__`` and ``__dir__`` that make every installed ``kind`` plugin an attribute."""
    adapted: dict[str, tuple[RlsdkPluginManager, Any]] = {}

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        pm = plugin_manager()
        if name not in adapted or adapted[name][0] is not pm:
            try:
                resolved = pm.resolve(kind, name)
            except UnknownPluginError as exc:
                raise AttributeError(f"rlsdk.slime.{kind} has no {name!r}: {exc}") from None
            adapted[name] = (pm, ADAPTERS.get(kind, generic_adapter)(resolved))
        return adapted[name][1]

    def __dir__() -> list[str]:
        return sorted(plugin_manager().names(kind))

    return __getattr__, __dir__


# ----- args and samples ---------------------------------------------------------------------------


class SlimeArgs:
    """slime's ``args`` as rlsdk's plugins read them: slime's values first, rlsdk's defaults for the options
    slime does not have. Writes go to slime's ``args``; the runtime rlsdk binds stays on this view."""

    def __init__(self, args: Namespace) -> None:
        object.__setattr__(self, "slime_args", args)

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(object.__getattribute__(self, "slime_args"), name)
        except AttributeError:
            option = core_options().get(name) or installed_options().get(name)
            if option is not None:  # rlsdk's default for an option slime does not have (core's or a plugin's)
                return copy.copy(option.default)
            raise AttributeError(f"neither slime's args nor rlsdk's options have {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.slime_args, name, value)

    def __copy__(self) -> SlimeArgs:
        """A view of a copy of slime's ``args`` (one eval dataset's overrides stay out of the run's)."""
        return SlimeArgs(copy.copy(self.slime_args))


_views: dict[int, SlimeArgs] = {}


def view(args: Namespace) -> RolloutConfig:
    """One view per slime ``args`` object (so an engine client built for it is built once), typed as the
    configuration it stands in for: it answers every option under its name."""
    if isinstance(args, SlimeArgs):
        return cast(RolloutConfig, args)
    found = _views.get(id(args))
    if found is None or found.slime_args is not args:
        found = _views[id(args)] = SlimeArgs(args)
    return cast(RolloutConfig, found)


def slime_class(module: str, name: str) -> Any:
    """slime's class when slime (or rlsdk's stand-in for it) is importable, else None."""
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError:
        return None


def to_rlsdk(sample: Any) -> Sample:
    return sample if isinstance(sample, Sample) else Sample.from_dict(sample.to_dict())


def to_slime(sample: Any) -> Any:
    cls = slime_class("slime.utils.types", "Sample")
    if cls is None or isinstance(sample, cls):
        return sample
    return cls.from_dict(sample.to_dict())


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _groups(groups: list[list[Any]], convert: Callable[[Any], Any]) -> list[list[Any]]:
    return [[convert(s) for s in group] for group in groups]


# ----- one adapter per kind -----------------------------------------------------------------------


def reward_adapter(resolved: Resolved) -> Callable[..., Any]:
    """``async rm(args, sample, **kw)`` (``samples`` for a group reward), as slime awaits it, through rlsdk's
    reward call point (a sync reward runs in a thread so it cannot stall slime's loop)."""

    async def call(args: Namespace, target: Any, **kwargs: Any) -> Any:
        evaluation = bool(kwargs.get("evaluation", False))
        return await call_reward(resolved, view(args), target, evaluation=evaluation)

    if resolved.record.group:

        async def group_reward(args: Namespace, samples: list[Any], **kwargs: Any) -> list[Any]:
            return await call(args, samples, **kwargs)

        return _named(group_reward, resolved)

    async def reward(args: Namespace, sample: Any, **kwargs: Any) -> Any:
        return await call(args, sample, **kwargs)

    return _named(reward, resolved)


def dynamic_filter_adapter(resolved: Resolved) -> Callable[..., Any]:
    """``f(args, samples, **kw)`` returning slime's ``DynamicFilterOutput`` when slime is importable."""

    def dynamic_filter(args: Namespace, samples: list[Any], **kwargs: Any) -> Any:
        verdict = resolved.func(view(args), samples, **kwargs)
        if not isinstance(verdict, DynamicFilterOutput):
            verdict = DynamicFilterOutput(keep=bool(verdict))
        cls = slime_class("slime.rollout.filter_hub.base_types", "DynamicFilterOutput")
        if cls is None or isinstance(verdict, cls):
            return verdict
        return cls(
            keep=bool(verdict.keep),
            reason=verdict.reason,
            keep_when_insufficient=verdict.keep_when_insufficient,
        )

    return _named(dynamic_filter, resolved)


def over_sampling_filter_adapter(resolved: Resolved) -> Callable[..., Any]:
    def over_sampling_filter(args: Namespace, groups: list[list[Any]], **kwargs: Any) -> list[list[Any]]:
        return resolved.func(view(args), groups, **kwargs)

    return _named(over_sampling_filter, resolved)


def buffer_filter_adapter(resolved: Resolved) -> Callable[..., Any]:
    def buffer_filter(
        args: Namespace, rollout_id: int | None, buffer: list[list[Any]], num_samples: int
    ) -> list:
        return resolved.func(view(args), rollout_id, buffer, num_samples)

    return _named(buffer_filter, resolved)


def custom_generate_adapter(resolved: Resolved) -> Callable[..., Any]:
    """``async generate(args, sample, sampling_params, evaluation=False)``: slime's sample in, converted
    to rlsdk's and back (a plugin may return several)."""

    async def generate(
        args: Namespace, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False
    ) -> Any:
        kwargs = {"evaluation": evaluation} if resolved.accepts_evaluation else {}
        result = resolved.func(view(args), to_rlsdk(sample), sampling_params, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return [to_slime(s) for s in result] if isinstance(result, list) else to_slime(result)

    return _named(generate, resolved)


class SlimeDataSource:
    """slime's data source as rlsdk's rollouts call it: ``get_samples(n, rollout_id)`` and
    ``add_samples(groups)`` with rlsdk's samples, whatever slime's own signatures are."""

    def __init__(self, data_source: Any) -> None:
        self.data_source = data_source
        params = inspect.signature(data_source.get_samples).parameters
        self._takes_rollout_id = len(params) > 1 or any(p.kind is p.VAR_POSITIONAL for p in params.values())

    def get_samples(self, num_samples: int, rollout_id: int | None = None) -> list[list[Sample]]:
        if self._takes_rollout_id:
            groups = self.data_source.get_samples(num_samples, rollout_id)
        else:
            groups = self.data_source.get_samples(num_samples)
        return _groups(groups, to_rlsdk)

    def add_samples(self, groups: list[list[Sample]], rollout_id: int | None = None) -> None:
        self.data_source.add_samples(_groups(groups, to_slime))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.data_source, name)


def generate_rollout_adapter(resolved: Resolved) -> Callable[..., Any]:
    """``generate_rollout(args, rollout_id, data_source, evaluation=False)`` returning slime's output
    types and samples when slime is importable."""

    def generate_rollout(args: Namespace, rollout_id: Any, data_source: Any, evaluation: bool = False) -> Any:
        rollout_args = view(args)
        source = SlimeDataSource(data_source) if data_source is not None else None  # eval may pass none
        output = resolved.func(rollout_args, rollout_id, source, evaluation=evaluation)
        if inspect.isawaitable(output):
            output = get_runtime(rollout_args).run(_awaited(output))
        return _slime_output(output, evaluation)

    return _named(generate_rollout, resolved)


def _slime_output(output: Any, evaluation: bool) -> Any:
    if evaluation:
        data = output.data if isinstance(output, RolloutFnEvalOutput) else output
        data = {
            name: {**d, "samples": [to_slime(s) for s in d.get("samples", [])]} for name, d in data.items()
        }
        cls: Any = slime_class("slime.rollout.base_types", "RolloutFnEvalOutput") or RolloutFnEvalOutput
        return cls(data=data, metrics=getattr(output, "metrics", None))
    groups = output.samples if isinstance(output, RolloutFnTrainOutput) else output
    train_cls: Any = slime_class("slime.rollout.base_types", "RolloutFnTrainOutput") or RolloutFnTrainOutput
    return train_cls(samples=_groups(groups, to_slime), metrics=getattr(output, "metrics", None))


def _named(func: Callable[..., Any], resolved: Resolved) -> Callable[..., Any]:
    func.__name__ = func.__qualname__ = resolved.name
    func.__doc__ = f"{resolved.describe()}, adapted to slime's calling convention."
    func.__wrapped_plugin__ = resolved  # type: ignore[attr-defined]
    return func


# ----- slime's other extension points ----------------------------------------------------------------


def sample_hook_adapter(resolved: Resolved) -> Callable[..., Any]:
    """``async hook(args, sample, *, rollout_id=None, evaluation=False)``: slime's sample in and back; a hook
    that fails raises (slime stops on it), naming the plugin."""

    async def sample_hook(
        args: Namespace, sample: Any, *, rollout_id: Any = None, evaluation: bool = False
    ) -> Any:
        out = await call_sample_hooks(
            [resolved], view(args), to_rlsdk(sample), rollout_id=rollout_id, evaluation=evaluation
        )
        if out.status is Sample.Status.FAILED and "generate_error" in out.metadata:
            raise PluginCallError(out.metadata["generate_error"])
        return to_slime(out)

    return _named(sample_hook, resolved)


def rollout_sample_filter_adapter(resolved: Resolved) -> Callable[..., Any]:
    """``sample_filter(args, groups)``: marks slime's own samples ``remove_sample``."""

    def rollout_sample_filter(args: Namespace, groups: list[list[Any]]) -> None:
        converted = _groups(groups, to_rlsdk)
        call_rollout_sample_filter(resolved, view(args), converted)
        for group, marked in zip(groups, converted, strict=True):
            for sample, mark in zip(group, marked, strict=True):
                sample.remove_sample = bool(mark.remove_sample)

    return _named(rollout_sample_filter, resolved)


def all_samples_process_adapter(resolved: Resolved) -> Callable[..., Any]:
    def all_samples_process(args: Namespace, all_groups: list[list[Any]], data_source: Any) -> None:
        call_all_samples_process(resolved, view(args), _groups(all_groups, to_rlsdk), data_source)

    return _named(all_samples_process, resolved)


def advantage_adapter(resolved: Resolved) -> Callable[..., Any]:
    def advantage(args: Namespace, rollout_data: dict[str, Any]) -> None:
        call_advantage(resolved, view(args), rollout_data)

    return _named(advantage, resolved)


def reward_post_process_adapter(resolved: Resolved) -> Callable[..., Any]:
    def reward_post_process(args: Namespace, samples: list[Any]) -> tuple[list[float], list[float]]:
        return call_reward_post_process(resolved, view(args), [to_rlsdk(s) for s in samples])

    return _named(reward_post_process, resolved)


def rollout_data_postprocess_adapter(resolved: Resolved) -> Callable[..., Any]:
    def rollout_data_postprocess(args: Namespace, rollout_id: Any, rollout_data: dict[str, Any]) -> None:
        call_rollout_data_postprocess(resolved, view(args), rollout_id, rollout_data)

    return _named(rollout_data_postprocess, resolved)


def convert_samples_to_train_data_adapter(resolved: Resolved) -> Callable[..., Any]:
    def convert_samples_to_train_data(args: Namespace, samples: list[Any]) -> dict[str, Any]:
        return call_convert_samples_to_train_data(resolved, view(args), [to_rlsdk(s) for s in samples])

    return _named(convert_samples_to_train_data, resolved)


def _note(args: Namespace, name: str, value: Any) -> None:
    """slime's log contract: a log function records the rollout it logged on ``args`` (where ``args`` takes
    attributes)."""
    try:
        setattr(args, name, value)
    except (AttributeError, TypeError):
        pass


def rollout_log_adapter(resolved: Resolved) -> Callable[..., Any]:
    def rollout_log(
        rollout_id: Any, args: Namespace, samples: list[Any], rollout_extra_metrics: Any, rollout_time: Any
    ) -> bool:
        metrics = dict(rollout_extra_metrics or {})
        converted = [to_rlsdk(s) for s in samples]
        logged = call_rollout_log(resolved, rollout_id, view(args), converted, metrics, rollout_time)
        _note(args, "logged_rollout_id", rollout_id)
        return logged

    return _named(rollout_log, resolved)


def eval_rollout_log_adapter(resolved: Resolved) -> Callable[..., Any]:
    def eval_rollout_log(rollout_id: Any, args: Namespace, data: dict[str, Any], extra_metrics: Any) -> bool:
        converted = {
            name: {**part, "samples": [to_rlsdk(s) for s in part.get("samples", [])]}
            for name, part in data.items()
        }
        logged = call_eval_rollout_log(resolved, rollout_id, view(args), converted, dict(extra_metrics or {}))
        _note(args, "logged_eval_rollout_id", rollout_id)
        return logged

    return _named(eval_rollout_log, resolved)


def pg_loss_reducer_adapter(resolved: Resolved) -> Callable[..., Any]:
    def pg_loss_reducer(
        total_lengths: Any, response_lengths: Any, loss_masks: Any, calculate_per_token_loss: bool = False
    ) -> Callable[[Any], Any]:
        return call_pg_loss_reducer(
            resolved, total_lengths, response_lengths, loss_masks, calculate_per_token_loss
        )

    return _named(pg_loss_reducer, resolved)


def tis_function_adapter(resolved: Resolved) -> Callable[..., Any]:
    def tis_function(
        args: Namespace,
        pg_loss: Any,
        train_log_probs: Any,
        rollout_log_probs: Any,
        loss_masks: Any,
        total_lengths: Any,
        response_lengths: Any,
    ) -> tuple[Any, Any, Any]:
        return call_tis_function(
            resolved,
            args=view(args),
            pg_loss=pg_loss,
            train_log_probs=train_log_probs,
            rollout_log_probs=rollout_log_probs,
            loss_masks=loss_masks,
            total_lengths=total_lengths,
            response_lengths=response_lengths,
        )

    return _named(tis_function, resolved)


def data_source_adapter(resolved: Resolved) -> Callable[..., Any]:
    """A class with slime's data-source interface (``__init__(self, args)``, ``get_samples(num_samples)``,
    ``add_samples``, ``save``, ``load``, ``__len__``) around the plugin's data source, slime's samples in and
    out; ``save``/``load`` keep its ``state_dict()`` in ``<args.save>/rollout/`` as slime keeps its own."""

    class DataSourceAdapter:
        def __init__(self, args: Namespace) -> None:
            self.args = args
            self.source = call_data_source(resolved, view(args))

        def get_samples(self, num_samples: int) -> list[list[Any]]:
            return _groups(self.source.get_samples(num_samples), to_slime)

        def add_samples(self, samples: list[list[Any]]) -> None:
            self.source.add_samples(_groups(samples, to_rlsdk))

        def _state_file(self, rollout_id: Any) -> Path | None:
            folder = getattr(self.args, "save", None)
            return Path(folder) / "rollout" / f"rlsdk_data_source_{rollout_id}.json" if folder else None

        def save(self, rollout_id: Any) -> None:
            path = self._state_file(rollout_id)
            if path is not None and callable(getattr(self.source, "state_dict", None)):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(self.source.state_dict()))

        def load(self, rollout_id: Any = None) -> None:
            path = self._state_file(rollout_id)
            if path is not None and path.exists() and callable(getattr(self.source, "load_state_dict", None)):
                self.source.load_state_dict(json.loads(path.read_text()))

        def __len__(self) -> int:
            return len(self.source)

    DataSourceAdapter.__name__ = DataSourceAdapter.__qualname__ = resolved.name
    DataSourceAdapter.__doc__ = f"{resolved.describe()}, adapted to slime's data-source interface."
    return DataSourceAdapter


def megatron_init_adapter(resolved: Resolved) -> Callable[..., Any]:
    def megatron_init(args: Namespace) -> None:
        call_megatron_init(resolved, view(args))

    return _named(megatron_init, resolved)


def megatron_before_log_prob_adapter(resolved: Resolved) -> Callable[..., Any]:
    def megatron_before_log_prob(args: Namespace, model: Any, store_prefix: str) -> None:
        call_megatron_before_log_prob(resolved, view(args), model, store_prefix)

    return _named(megatron_before_log_prob, resolved)


def megatron_before_train_step_adapter(resolved: Resolved) -> Callable[..., Any]:
    def megatron_before_train_step(
        args: Namespace, rollout_id: int, step_id: int, model: Any, optimizer: Any, opt_param_scheduler: Any
    ) -> None:
        call_megatron_before_train_step(
            resolved, view(args), rollout_id, step_id, model, optimizer, opt_param_scheduler
        )

    return _named(megatron_before_train_step, resolved)


def model_provider_adapter(resolved: Resolved) -> Callable[..., Any]:
    def model_provider(
        pre_process: bool = True, post_process: bool = True, vp_stage: int | None = None
    ) -> Any:
        return call_model_provider(
            resolved, pre_process=pre_process, post_process=post_process, vp_stage=vp_stage
        )

    return _named(model_provider, resolved)


def update_weight_post_write_adapter(resolved: Resolved) -> Callable[..., Any]:
    def update_weight_post_write(args: Namespace, version_dir: str, rollout_engines: Any) -> None:
        call_update_weight_post_write(resolved, view(args), version_dir, list(rollout_engines))

    return _named(update_weight_post_write, resolved)


SAMPLE_ARGUMENTS: dict[str, Callable[[Any], Any]] = {
    "sample": lambda sample: to_rlsdk(sample),
    "samples": lambda samples: [to_rlsdk(s) for s in samples],
    "groups": lambda groups: _groups(groups, to_rlsdk),
    "all_groups": lambda groups: _groups(groups, to_rlsdk),
}
"""How an adapter converts slime's arguments by name (a kind's ``call_args``) to rlsdk's."""


def generic_adapter(resolved: Resolved) -> Callable[..., Any]:
    """A kind with no adapter of its own, in slime's convention as its declaration gives it: ``args`` seen
    through rlsdk's defaults, slime's samples converted to rlsdk's, called through :func:`call_plugin`."""
    names = resolved.record.call_args

    def adapted(*arguments: Any) -> Any:
        converted = [
            view(value) if name == "args" else SAMPLE_ARGUMENTS.get(name, lambda v: v)(value)
            for name, value in zip(names, arguments, strict=False)
        ]
        return call_plugin(resolved, *converted, *arguments[len(names) :])

    return _named(adapted, resolved)


ADAPTERS: dict[str, Callable[[Resolved], Callable[..., Any]]] = {
    "reward": reward_adapter,
    "dynamic_filter": dynamic_filter_adapter,
    "over_sampling_filter": over_sampling_filter_adapter,
    "buffer_filter": buffer_filter_adapter,
    "custom_generate": custom_generate_adapter,
    "generate_rollout": generate_rollout_adapter,
    "sample_hook": sample_hook_adapter,
    "rollout_sample_filter": rollout_sample_filter_adapter,
    "all_samples_process": all_samples_process_adapter,
    "advantage": advantage_adapter,
    "reward_post_process": reward_post_process_adapter,
    "rollout_data_postprocess": rollout_data_postprocess_adapter,
    "convert_samples_to_train_data": convert_samples_to_train_data_adapter,
    "rollout_log": rollout_log_adapter,
    "eval_rollout_log": eval_rollout_log_adapter,
    "pg_loss_reducer": pg_loss_reducer_adapter,
    "tis_function": tis_function_adapter,
    "data_source": data_source_adapter,
    "megatron_init": megatron_init_adapter,
    "megatron_before_log_prob": megatron_before_log_prob_adapter,
    "megatron_before_train_step": megatron_before_train_step_adapter,
    "model_provider": model_provider_adapter,
    "update_weight_post_write": update_weight_post_write_adapter,
}
