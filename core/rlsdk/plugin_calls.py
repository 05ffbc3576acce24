"""Calling resolved plugins from the rollout loop: sync or async, guarded, with errors that name the
plugin, its package and the sample."""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any

from .concurrency import ConcurrencyLimit, gather_calls
from .deadlines import deadline
from .manager import RlsdkPluginManager
from .protocol import EngineError, EngineRequestError
from .records import Resolved
from .types import Sample

FINISHED = (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
DEFAULT_GENERATE = "rlsdk.generate:generate"
ENGINE_FAULT = "engine_fault"
"""Metadata key set (True) on a sample that failed because the engine did: unreachable, an HTTP 5xx after
retries, an unreadable answer. Not the sample's fault, so its prompt is served again."""


async def call_plugin(resolved: Resolved, *args: Any, **kwargs: Any) -> Any:
    """Call a sync or async implementation; sync ones run inline (filters are cheap)."""
    result = resolved.func(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


@dataclass
class StepPlugins:
    """The implementations one step calls, resolved (and validated) once per step."""

    pm: RlsdkPluginManager
    custom_generate: Resolved
    dynamic_filter: Resolved | None = None
    over_sampling_filter: Resolved | None = None
    _per_sample: dict[str, Resolved] = field(default_factory=dict)

    @classmethod
    def resolve(cls, args: Any, pm: RlsdkPluginManager) -> StepPlugins:
        def optional(kind: str, spec: str | None) -> Resolved | None:
            return pm.resolve(kind, spec) if spec else None

        return cls(
            pm=pm,
            custom_generate=pm.resolve("custom_generate", args.custom_generate_function_path or DEFAULT_GENERATE),
            dynamic_filter=optional("dynamic_filter", args.dynamic_sampling_filter_path),
            over_sampling_filter=optional("over_sampling_filter", args.over_sampling_filter_path),
        )

    def generator_for(self, sample: Sample) -> Resolved:
        """The sample's own ``generate_function_path`` (slime's per-sample override) or the run's."""
        spec = sample.generate_function_path
        if not spec:
            return self.custom_generate
        if spec not in self._per_sample:
            self._per_sample[spec] = self.pm.resolve("custom_generate", spec)
        return self._per_sample[spec]


def seeded(args: Any, sampling_params: dict[str, Any], position: int) -> dict[str, Any]:
    """Deterministic mode gives sample ``i`` of a group the seed ``rollout_seed + i``."""
    if not args.sglang_enable_deterministic_inference:
        return sampling_params
    return {**sampling_params, "sampling_seed": args.rollout_seed + position}


async def generate_group(
    args: Any, plugins: StepPlugins, group: list[Sample], sampling_params: dict[str, Any],
    limit: ConcurrencyLimit, evaluation: bool = False,
) -> None:
    """Run custom_generate on every unfinished sample of ``group`` concurrently; the group is updated
    in place (a generator may return several samples for one)."""
    calls = [generate_sample(args, plugins, sample, seeded(args, sampling_params, i), limit, evaluation)
             for i, sample in enumerate(group)]
    results = await gather_calls(calls)
    group[:] = [s for produced in results for s in produced]


async def generate_sample(
    args: Any, plugins: StepPlugins, sample: Sample, sampling_params: dict[str, Any],
    limit: ConcurrencyLimit, evaluation: bool,
) -> list[Sample]:
    """One sample through its custom_generate, under the concurrency bound and the hang timeout."""
    if sample.status in FINISHED:
        return [sample]  # completed in an earlier step and served again from the buffer
    resolved = plugins.generator_for(sample)
    kwargs = {"evaluation": evaluation} if resolved.accepts_evaluation else {}
    started = time.perf_counter()
    try:
        if not limit.take_now():
            await limit.take()
        try:
            # the hang timeout starts once the limit lets the sample run, not while it queues
            with deadline(args.generate_timeout):  # call_plugin, inlined: one coroutine less per sample
                result = resolved.func(args, sample, sampling_params, **kwargs)
                if resolved.is_async or inspect.isawaitable(result):
                    result = await result
        finally:
            limit.give()
    except TimeoutError:
        return [_failed(sample, f"{_where(resolved, sample)} hung: no result after {args.generate_timeout} s")]
    except Exception as exc:  # a plugin's bug must not lose the step's other samples
        failed = _failed(sample, f"{_where(resolved, sample)} raised {type(exc).__name__}: {exc}")
        if is_engine_fault(exc):
            failed.metadata[ENGINE_FAULT] = True
        return [failed]
    if type(result) is Sample:  # the usual case, checked first
        produced = [result]
    else:
        produced = result if isinstance(result, list) else [result]
        produced = [Sample.from_dict(s.to_dict()) if _is_foreign_sample(s) else s for s in produced]
        if not produced or not all(isinstance(s, Sample) for s in produced):
            return [_failed(sample, f"{_where(resolved, sample)} returned {type(result).__name__}, "
                                    "expected Sample or list[Sample]")]
    seconds = time.perf_counter() - started
    for out in produced:
        if type(out.status) is not Sample.Status:  # slime's Status enum, a plain string, or nonsense
            try:
                out.status = Sample.Status(out.status)
            except ValueError:
                return [_failed(sample, f"{_where(resolved, sample)} set the unknown status {out.status!r} "
                                        f"(expected one of {[s.value for s in Sample.Status]})")]
        out.metadata["generate_seconds"] = seconds
    return produced


def is_engine_fault(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an exception it was raised from, is the engine's failure (not a 4xx: a request
    the engine refused is the request's fault)."""
    while exc is not None:
        if isinstance(exc, EngineError) and not isinstance(exc, EngineRequestError):
            return True
        exc = exc.__cause__
    return False


def _is_foreign_sample(value: Any) -> bool:
    """A Sample of slime's own class (slime installed): converted through its dict, as slime writes it."""
    return not isinstance(value, Sample) and type(value).__name__ == "Sample" and hasattr(value, "to_dict")


def _where(resolved: Resolved, sample: Sample) -> str:
    return f"{resolved.describe()} on sample {sample.group_index}/{sample.index}"


def _failed(sample: Sample, error: str) -> Sample:
    sample.status = Sample.Status.FAILED
    sample.metadata["generate_error"] = error
    return sample
