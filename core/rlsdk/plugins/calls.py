"""The call points of the rollout kinds (generate_rollout, custom_generate, reward, the three filters) and of
the engine factory: every caller (the rollout loop, eval, ``rlsdk score``, the data source, ``rlsdk run``,
``rlsdk serve``, a Ray engine actor and :mod:`rlsdk.testing`'s contract checks) calls a resolved plugin of
these kinds through the function of its kind here, so a plugin that passes the testing kit behaves the same
in the loop. The kinds that live a floor up have theirs beside their protocol: trainers
(:func:`rlsdk.training.trainer.build_trainer`), tools (:func:`rlsdk.rollout.tools.call_tool`), tool-call
parsers (:mod:`rlsdk.agents.completions`), agents (:mod:`rlsdk.agents.openai_agent`), task generators
(:mod:`rlsdk.rollout.buffer_service`), losses (the trainer's own forward pass). A ``cheap`` reward has a sync
fast path (:func:`call_cheap_reward`) that checks its result as :func:`call_reward` does. slime's other
extension points have theirs at the end, the megatron trainer's hooks (called through
:class:`rlsdk.trainer_api.MegatronHooks`) and the disk weight sync's post-write hook among them.

Every call point takes the resolved plugin first, then the plugin's own arguments in the plugin's order (its
record's ``call_args``), then keyword-only options of the call (a timeout, the runtime, a concurrency limit).
Each calls the plugin the same way, sync or async (an awaitable result is awaited), turns any failure
(an exception, a timeout, a result of the wrong shape) into a :class:`~rlsdk.errors.PluginCallError` that names
the plugin, its distribution and the sample or group, and checks the result the same way for every caller.
``custom_generate`` and ``reward`` failures are recorded on their sample instead (one bad sample must not lose
the step's others); the rest raise.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import threading
import time
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

from ..aio.blocking import blocking_pool
from ..aio.concurrency import ConcurrencyLimit
from ..aio.deadlines import deadline
from ..aio.stopping import StopRequest
from ..engines.engine import InferenceEngine
from ..engines.protocol import EngineError, EngineRequestError
from ..errors import PluginCallError, RlsdkError
from ..types import DynamicFilterOutput, RolloutFnEvalOutput, RolloutFnTrainOutput, Sample
from .records import Resolved
from ..options import RunOptions


SyncRewardRunner = Callable[[Any, Resolved[Any], Any, dict[str, Any], float | None], Awaitable[Any]]
"""Runs a sync reward somewhere else (``(args, resolved, target, kwargs, timeout)``): a run on Ray sends
rewards to the cluster's task pool with one (``ray_sync_rewards``)."""

FINISHED = (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)


def unfinished(group: list[Sample]) -> bool:
    """Whether a sample of ``group`` neither finished nor failed: aborted mid-generation (by a weight
    update, or its engine's death)."""
    return not all(s.status in FINISHED or s.status is Sample.Status.FAILED for s in group)


ENGINE_FAULT = "engine_fault"
"""Metadata key set (True) on a sample that failed because the engine did: unreachable, an HTTP 5xx after
retries, an unreadable answer. Not the sample's fault, so its prompt is served again."""


def run_to_completion(result: Any) -> Any:
    """``result``, awaited to completion when it is awaitable, from sync code: on a fresh event loop, or
    on one in a helper thread when this thread already runs a loop (a sync caller inside the rollout step)."""
    if not inspect.isawaitable(result):
        return result
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_await(result))
    outcome: dict[str, Any] = {}

    def finish() -> None:
        try:
            outcome["value"] = asyncio.run(_await(result))
        except BaseException as exc:  # handed back to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=finish, name="rlsdk-sync-plugin-call")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _raised(resolved: Resolved, where: str, exc: BaseException) -> PluginCallError:
    return PluginCallError(f"{resolved.describe()} {where} raised {type(exc).__name__}: {exc}")


def _group_where(group: list[Sample]) -> str:
    if not group:
        return "on an empty group"
    first = group[0]
    return f"on group {first.group_index} (samples {', '.join(str(s.index) for s in group)})"


def _sample_where(sample: Sample) -> str:
    return f"on sample {sample.group_index}/{sample.index}"


# ----- generate_rollout ------------------------------------------------------------------------------------


def call_generate_rollout(
    resolved: Resolved, args: RunOptions, rollout_id: int, data_source: Any, *, runtime: Any
) -> RolloutFnTrainOutput:
    """One whole training step from the main thread (an async rollout runs on ``runtime``'s loop); a bare list
    of groups is wrapped, as slime does."""
    where = f"at rollout {rollout_id}"
    return as_train_output(
        resolved, _call_rollout(runtime, resolved, where, args, rollout_id, data_source), where
    )


def call_eval_rollout(
    resolved: Resolved, args: RunOptions, rollout_id: int, *, runtime: Any
) -> RolloutFnEvalOutput:
    """generate_rollout with ``evaluation=True`` (no data source); an eval dict is wrapped, as slime does."""
    where = f"at eval after rollout {rollout_id}"
    result = _call_rollout(runtime, resolved, where, args, rollout_id, None, evaluation=True)
    return as_eval_output(resolved, result, where)


def _call_rollout(runtime: Any, resolved: Resolved, where: str, *args: Any, **kwargs: Any) -> Any:
    """A sync rollout is called directly, an async one runs on the run's loop. rlsdk's own errors (a data
    error, a reward policy of ``fail``) pass unchanged: they already say what went wrong."""
    try:
        result = resolved.func(*args, **kwargs)
        if inspect.isawaitable(result):
            result = runtime.run(_await(result))
    except RlsdkError:
        raise
    except Exception as exc:
        raise _raised(resolved, where, exc) from exc
    return result


def as_train_output(resolved: Resolved, result: Any, where: str = "") -> RolloutFnTrainOutput:
    """slime accepts a bare list of groups from generate_rollout; so do we."""
    if isinstance(result, RolloutFnTrainOutput):
        return result
    if isinstance(result, list) and all(
        isinstance(g, list) and all(isinstance(s, Sample) for s in g) for g in result
    ):
        return RolloutFnTrainOutput(samples=result)
    raise PluginCallError(
        f"{resolved.describe()} {where} returned {type(result).__name__}: expected "
        "RolloutFnTrainOutput or a list of groups of samples"
    )


def as_eval_output(resolved: Resolved, result: Any, where: str = "") -> RolloutFnEvalOutput:
    if isinstance(result, RolloutFnEvalOutput):
        return result
    if isinstance(result, dict):
        return RolloutFnEvalOutput(data=result)
    raise PluginCallError(
        f"{resolved.describe()} {where} returned {type(result).__name__}: expected "
        "RolloutFnEvalOutput or a dict"
    )


# ----- custom_generate -------------------------------------------------------------------------------------


async def call_custom_generate(
    resolved: Resolved,
    args: RunOptions,
    sample: Sample,
    sampling_params: dict[str, Any],
    *,
    limit: ConcurrencyLimit | None = None,
    evaluation: bool = False,
) -> list[Sample]:
    """One sample through its custom_generate, under the concurrency bound and ``args.generate_timeout``.
    Returns the samples it produced; a failure returns the sample failed, the error (naming the plugin) in
    ``metadata["generate_error"]``."""
    if sample.status in FINISHED:
        return [sample]  # completed in an earlier step and served again from the buffer
    kwargs = {"evaluation": evaluation} if resolved.accepts_evaluation else {}
    started = time.perf_counter()
    try:
        if limit is not None and not limit.take_now():
            await limit.take()
        try:
            # the hang timeout starts once the limit lets the sample run, not while it queues
            with deadline(args.generate_timeout):
                result = resolved.func(args, sample, sampling_params, **kwargs)
                if resolved.is_async or inspect.isawaitable(result):
                    result = await result
        finally:
            if limit is not None:
                limit.give()
    except TimeoutError:  # an engine that accepted the request and never answered, most often: its prompt
        # goes back to the data as an engine fault's does
        hung = _failed(
            sample,
            f"{resolved.describe()} {_sample_where(sample)} hung: no result after "
            f"{args.generate_timeout} s (generate_timeout)",
        )
        hung.metadata[ENGINE_FAULT] = True
        return [hung]
    except Exception as exc:  # a plugin's bug must not lose the step's other samples
        failed = _failed(sample, str(_raised(resolved, _sample_where(sample), exc)))
        if is_engine_fault(exc):
            failed.metadata[ENGINE_FAULT] = True
        return [failed]
    if type(result) is Sample:  # the usual case, checked first
        produced = [result]
    else:
        produced = result if isinstance(result, list) else [result]
        produced = [Sample.from_dict(s.to_dict()) if _is_foreign_sample(s) else s for s in produced]
        if not produced or not all(isinstance(s, Sample) for s in produced):
            return [
                _failed(
                    sample,
                    f"{resolved.describe()} {_sample_where(sample)} returned "
                    f"{type(result).__name__}, expected Sample or list[Sample]",
                )
            ]
    seconds = time.perf_counter() - started
    for out in produced:
        if type(out.status) is not Sample.Status:  # slime's Status enum, a plain string, or nonsense
            try:
                out.status = Sample.Status(out.status)
            except ValueError:
                return [
                    _failed(
                        sample,
                        f"{resolved.describe()} {_sample_where(sample)} set the unknown status "
                        f"{out.status!r} (expected one of {[s.value for s in Sample.Status]})",
                    )
                ]
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


def _failed(sample: Sample, error: str) -> Sample:
    sample.status = Sample.Status.FAILED
    sample.metadata["generate_error"] = error
    return sample


# ----- reward ----------------------------------------------------------------------------------------------


class InvalidReward(PluginCallError):
    """A reward raised, timed out or returned something that is not a reward; ``reason`` says which."""

    def __init__(self, resolved: Resolved, where: str, reason: str) -> None:
        super().__init__(f"{resolved.describe()} {where}: {reason}")
        self.reason = reason


async def call_reward(
    resolved: Resolved,
    args: RunOptions,
    target: Sample | list[Sample],
    *,
    evaluation: bool = False,
    timeout: float | None = None,
    runner: SyncRewardRunner | None = None,
) -> Any:
    """The reward of one sample, or the list of rewards of a group (``target`` a list) for a group reward: the
    one place a reward is dispatched, for the rollout loop, eval, ``rlsdk score``, the testing kit and slime.

    Async rewards are awaited; sync ones run in a thread of :mod:`rlsdk.aio.blocking`'s pool so a slow one
    cannot stall the loop (abandoned at ``timeout``), or with ``runner`` where one is given (Ray tasks), except
    ``cheap`` ones, which are called inline (:func:`call_cheap_reward`). Returns a number, a dict, or None (the
    reward marks the sample invalid); raises :class:`InvalidReward` otherwise."""
    if resolved.record.cheap and not resolved.is_async:
        return call_cheap_reward(resolved, args, target, evaluation=evaluation)
    where = _reward_where(target)
    kwargs = {"evaluation": evaluation} if resolved.accepts_evaluation else {}
    try:
        with deadline(timeout):
            if resolved.is_async:
                result = await resolved.func(args, target, **kwargs)
            elif runner is not None:
                result = await runner(args, resolved, target, kwargs, timeout)
            else:
                result = await blocking_pool().run(resolved.func, args, target, **kwargs)
            if inspect.isawaitable(result):
                result = await result
    except InvalidReward:  # a wrapped reward's own (``boxed_`` names): it names the inner reward
        raise
    except (TimeoutError, asyncio.TimeoutError) as exc:
        reason = (
            f"timed out after {timeout:g}s (reward_timeout)"
            if not str(exc) and timeout
            else f"raised {type(exc).__name__}: {exc}"
        )
        raise InvalidReward(resolved, where, reason) from exc
    except Exception as exc:
        raise InvalidReward(resolved, where, f"raised {type(exc).__name__}: {exc}") from exc
    return checked_reward(resolved, target, result)


def call_cheap_reward(
    resolved: Resolved, args: RunOptions, target: Sample | list[Sample], *, evaluation: bool = False
) -> Any:
    """:func:`call_reward` for a ``cheap`` reward from sync code on the loop: no coroutine, no thread, no
    timeout (the rollout loop's fast path for exact-match rewards)."""
    kwargs = {"evaluation": evaluation} if resolved.accepts_evaluation else {}
    try:
        result = resolved.func(args, target, **kwargs)
    except Exception as exc:
        raise InvalidReward(resolved, _reward_where(target), f"raised {type(exc).__name__}: {exc}") from exc
    return checked_reward(resolved, target, result)


def _reward_where(target: Sample | list[Sample]) -> str:
    return _group_where(target) if isinstance(target, list) else _sample_where(target)


def checked_reward(resolved: Resolved, target: Sample | list[Sample], result: Any) -> Any:
    """``result`` when it is a reward for ``target`` (a number, a dict or None; for a group, a list of them,
    one per sample), else :class:`InvalidReward`."""
    if isinstance(target, list):
        if not isinstance(result, (list, tuple)) or len(result) != len(target):
            got = (
                f"{type(result).__name__} of {len(result)}"
                if isinstance(result, (list, tuple))
                else repr(result)[:100]
            )
            raise InvalidReward(
                resolved,
                _reward_where(target),
                f"group reward returned {got}, expected a list of {len(target)}",
            )
        for value in result:
            _check_reward(resolved, target, value)
        return list(result)
    _check_reward(resolved, target, result)
    return result


def _check_reward(resolved: Resolved, target: Sample | list[Sample], value: Any) -> None:
    problem = None if value is None else reward_problem(value)
    if problem:  # where is said only then: the loop checks every sample's reward
        raise InvalidReward(resolved, _reward_where(target), problem)


MAX_ABS_REWARD = 1e15
"""Largest reward magnitude taken; beyond it a reward is invalid (1e200 squared overflows a float)."""


def reward_problem(reward: Any) -> str | None:
    """Why ``reward`` is not a valid reward (a finite number or a dict), or None when it is."""
    if isinstance(reward, dict):
        return None
    # a float, the usual case, is tested before the slower abstract-class check
    if type(reward) is float or (isinstance(reward, numbers.Real) and not isinstance(reward, bool)):
        try:
            value = float(reward)
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            return f"returned the non-finite number {repr(reward)[:40]}"
        if abs(value) > MAX_ABS_REWARD:  # its square overflows advantages and statistics
            return f"returned {value:g}, outside +-{MAX_ABS_REWARD:g}"
        return None
    return f"returned {type(reward).__name__} {repr(reward)[:100]}, expected a number or a dict"


# ----- filters ---------------------------------------------------------------------------------------------


async def call_dynamic_filter(
    resolved: Resolved, args: RunOptions, group: list[Sample]
) -> DynamicFilterOutput:
    """The filter's verdict on one finished group: a bool (also a numpy or torch boolean, as slime's own filter
    returns), slime's ``DynamicFilterOutput`` or rlsdk's, always given back as rlsdk's."""
    try:
        verdict = resolved.func(args, group)
        if inspect.isawaitable(verdict):
            verdict = await verdict
    except Exception as exc:
        raise _raised(resolved, _group_where(group), exc) from exc
    if isinstance(verdict, DynamicFilterOutput):
        return verdict
    if isinstance(verdict, bool) or getattr(verdict, "ndim", None) == 0:
        return DynamicFilterOutput(keep=bool(verdict))
    if type(verdict).__name__ == "DynamicFilterOutput":  # slime's own class
        return DynamicFilterOutput(
            keep=bool(verdict.keep),
            reason=verdict.reason,
            keep_when_insufficient=bool(getattr(verdict, "keep_when_insufficient", False)),
        )
    raise PluginCallError(
        f"{resolved.describe()} {_group_where(group)} returned {type(verdict).__name__}: "
        "expected DynamicFilterOutput or bool"
    )


async def call_over_sampling_filter(
    resolved: Resolved, args: RunOptions, groups: list[list[Sample]]
) -> list[list[Sample]]:
    """The kept groups in the filter's order: a list of groups it was given, none twice (it may leave some out)."""
    where = f"on {len(groups)} kept groups"
    try:
        ordered = resolved.func(args, list(groups))
        if inspect.isawaitable(ordered):
            ordered = await ordered
    except Exception as exc:
        raise _raised(resolved, where, exc) from exc
    given = {id(g) for g in groups}
    if not isinstance(ordered, list):
        raise PluginCallError(
            f"{resolved.describe()} {where} returned {type(ordered).__name__}: expected a list "
            "of the groups it was given"
        )
    returned = [id(g) for g in ordered]
    if not set(returned) <= given or len(set(returned)) != len(returned):
        raise PluginCallError(
            f"{resolved.describe()} {where} returned a group twice or one it was not given: it "
            "must return a list of the groups it was given"
        )
    return ordered


def call_buffer_filter(
    resolved: Resolved, args: RunOptions, rollout_id: int, buffer: list[list[Sample]], num_samples: int
) -> tuple[list[list[Sample]], list[list[Sample]]]:
    """``(served, left)``: the groups the filter serves (at most ``num_samples``) and the buffer it leaves.

    The filter works on a copy, so ``buffer`` is unchanged when it fails; sync code calls it (slime's data
    source API is sync), an async filter is run to completion. Groups in neither list were dropped by it."""
    where = f"choosing {num_samples} of {len(buffer)} buffered groups at rollout {rollout_id}"
    left = list(buffer)
    given = {id(g) for g in buffer}
    try:
        served = run_to_completion(resolved.func(args, rollout_id, left, num_samples))
    except Exception as exc:
        raise PluginCallError(
            f"{resolved.describe()} raised {type(exc).__name__}: {exc} ({where}); the buffer is unchanged"
        ) from exc
    problem = _buffer_problem(served, left, given, num_samples)
    if problem:
        raise PluginCallError(f"{resolved.describe()} {problem} ({where}); the buffer is unchanged")
    return served, left


def _buffer_problem(served: Any, left: list[Any], given: set[int], num_samples: int) -> str | None:
    if not isinstance(served, list):
        return f"returned {type(served).__name__}, expected a list of groups"
    if len(served) > num_samples:
        return f"returned {len(served)} groups when asked for at most {num_samples}"
    served_ids = [id(g) for g in served]
    if len(set(served_ids)) != len(served_ids) or not set(served_ids) <= given:
        return "returned a group twice or a group that was not in the buffer"
    if any(id(g) not in given for g in left):
        return "added groups to the buffer"
    if set(served_ids) & {id(g) for g in left}:
        return "left served groups in the buffer"
    return None


# ----- engine ----------------------------------------------------------------------------------------------


def call_engine(resolved: Resolved, args: RunOptions) -> Any:
    """Build the engine the factory makes from ``args``: an :class:`rlsdk.engine_api.InferenceEngine`."""
    try:
        engine = run_to_completion(resolved.func(args))
    except RlsdkError:
        raise
    except Exception as exc:
        raise _raised(resolved, "building the engine", exc) from exc
    if not isinstance(engine, InferenceEngine):
        raise PluginCallError(
            f"{resolved.describe()} returned {type(engine).__name__}: expected an rlsdk.engine_api.InferenceEngine"
        )
    return engine


# ----- slime's other extension points ----------------------------------------------------------------------


async def call_sample_hooks(
    hooks: list[Resolved], args: RunOptions, sample: Sample, *, rollout_id: int | None, evaluation: bool
) -> Sample:
    """``sample`` through every sample hook in order (each gets the previous one's sample); a hook that raises
    or returns something other than a Sample or None gives the sample back failed, the error naming the hook
    in ``metadata["generate_error"]``."""
    for resolved in hooks:
        kwargs = _declared(resolved.func, {"rollout_id": rollout_id, "evaluation": evaluation})
        try:
            result = resolved.func(args, sample, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            return _failed(sample, str(_raised(resolved, _sample_where(sample), exc)))
        if result is None:
            continue
        if _is_foreign_sample(result):
            result = Sample.from_dict(result.to_dict())
        if not isinstance(result, Sample):
            return _failed(
                sample,
                f"{resolved.describe()} {_sample_where(sample)} returned {type(result).__name__}, "
                "expected Sample or None",
            )
        sample = result
    return sample


def call_rollout_sample_filter(resolved: Resolved, args: RunOptions, groups: list[list[Sample]]) -> int:
    """Let the filter mark samples ``remove_sample``; returns how many are marked. The groups must keep their
    samples (it marks, it does not remove)."""
    where = f"on {len(groups)} kept groups"
    sizes = [len(g) for g in groups]
    _call_sync(resolved, where, args, groups)
    if [len(g) for g in groups] != sizes:
        raise PluginCallError(
            f"{resolved.describe()} {where} changed the groups: mark samples remove_sample instead"
        )
    return sum(bool(s.remove_sample) for g in groups for s in g)


def call_all_samples_process(
    resolved: Resolved, args: RunOptions, groups: list[list[Sample]], data_source: Any
) -> None:
    """Hand every group the step finished to the plugin."""
    _call_sync(resolved, f"on the {len(groups)} groups of a step", args, groups, data_source)


def _declared(func: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The ``kwargs`` that ``func`` declares (all of them when it takes ``**kwargs``), as slime passes them."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def call_plugin(resolved: Resolved, *arguments: Any, where: str = "") -> Any:
    """The call point of a kind that needs nothing beyond its declaration: ``func(*arguments)`` (the record's
    ``call_args``, in order) from sync code, an awaitable result run to completion, its failure named, its
    result checked by the record (:meth:`~rlsdk.plugins.records.PluginRecord.result_problem`)."""
    where = where or f"at a {resolved.record.scope}"
    result = _call_sync(resolved, where, *arguments)
    problem = resolved.record.result_problem(result)
    if problem:
        raise PluginCallError(f"{resolved.describe()} {where} {problem}")
    return result


def _call_sync(resolved: Resolved, where: str, *args: Any, **kwargs: Any) -> Any:
    """A trainer- or job-side plugin called from sync code (an awaitable result is run to completion);
    rlsdk's own errors pass unchanged."""
    try:
        return run_to_completion(resolved.func(*args, **kwargs))
    except RlsdkError:
        raise
    except Exception as exc:
        raise _raised(resolved, where, exc) from exc


def call_advantage(resolved: Resolved, args: RunOptions, rollout_data: dict[str, Any]) -> list[Any]:
    """The advantages an advantage plugin sets in ``rollout_data`` (one entry per sample, as many as
    ``rollout_data["rewards"]``)."""
    where = f"on {len(rollout_data.get('rewards', []))} samples"
    _call_sync(resolved, where, args, rollout_data)
    advantages = rollout_data.get("advantages")
    expected = len(rollout_data.get("rewards", []))
    if not isinstance(advantages, (list, tuple)) or len(advantages) != expected:
        got = "nothing" if advantages is None else f"{type(advantages).__name__} {repr(advantages)[:80]}"
        raise PluginCallError(
            f"{resolved.describe()} {where} set rollout_data['advantages'] to {got}: expected a list of "
            f"{expected} per-token tensors"
        )
    return list(advantages)


def call_reward_post_process(
    resolved: Resolved, args: RunOptions, samples: list[Sample]
) -> tuple[list[float], list[float]]:
    """``(raw_rewards, rewards)``: two lists of finite numbers, one per sample."""
    where = f"on {len(samples)} samples"
    result = _call_sync(resolved, where, args, samples)
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise PluginCallError(
            f"{resolved.describe()} {where} returned {type(result).__name__}: expected (raw_rewards, rewards)"
        )
    lists = []
    for label, values in zip(("raw_rewards", "rewards"), result, strict=True):
        values = values.tolist() if hasattr(values, "tolist") else values
        if not isinstance(values, (list, tuple)) or len(values) != len(samples):
            raise PluginCallError(
                f"{resolved.describe()} {where} returned {label} of {type(values).__name__} "
                f"{repr(values)[:80]}: expected a list of {len(samples)} numbers"
            )
        problems = [reward_problem(v) for v in values]
        bad = next((p for p in problems if p), None)
        if bad:
            raise PluginCallError(f"{resolved.describe()} {where}: {label} {bad}")
        lists.append([float(v) for v in values])
    return lists[0], lists[1]


def call_rollout_data_postprocess(
    resolved: Resolved, args: RunOptions, rollout_id: int, rollout_data: dict[str, Any]
) -> None:
    """Let the plugin edit ``rollout_data`` in place; the per-sample lists must keep their lengths."""
    where = f"at rollout {rollout_id}"
    lengths = {k: len(v) for k, v in rollout_data.items() if isinstance(v, list)}
    _call_sync(resolved, where, args, rollout_id, rollout_data)
    changed = [
        k
        for k, n in lengths.items()
        if not isinstance(rollout_data.get(k), list) or len(rollout_data[k]) != n
    ]
    if changed:
        raise PluginCallError(
            f"{resolved.describe()} {where} changed the length of rollout_data {changed}: one entry per sample"
        )


TRAIN_DATA_KEYS = (
    "tokens",
    "response_lengths",
    "rewards",
    "raw_reward",
    "truncated",
    "sample_indices",
    "loss_masks",
)
"""What slime's trainer reads from a converted step (``convert_samples_to_train_data``)."""


def call_convert_samples_to_train_data(
    resolved: Resolved, args: RunOptions, samples: list[Sample]
) -> dict[str, Any]:
    """slime's training-data dict: :data:`TRAIN_DATA_KEYS` at least, each a list with one entry per sample."""
    where = f"on {len(samples)} samples"
    data = _call_sync(resolved, where, args, samples)
    if not isinstance(data, dict):
        raise PluginCallError(
            f"{resolved.describe()} {where} returned {type(data).__name__}: expected a dict"
        )
    missing = [k for k in TRAIN_DATA_KEYS if k not in data]
    short = [k for k in TRAIN_DATA_KEYS if k in data and len(data[k]) != len(samples)]
    if missing or short:
        raise PluginCallError(
            f"{resolved.describe()} {where} returned a dict "
            + (f"without {missing}" if missing else f"whose {short} do not have one entry per sample")
        )
    return data


def _log_result(resolved: Resolved, where: str, result: Any) -> bool:
    if result is None or isinstance(result, bool):
        return bool(result)
    raise PluginCallError(f"{resolved.describe()} {where} returned {type(result).__name__}: expected a bool")


def call_rollout_log(
    resolved: Resolved,
    rollout_id: int,
    args: RunOptions,
    samples: list[Sample],
    metrics: dict[str, Any],
    rollout_time: float,
    *,
    stop: StopRequest | None = None,
) -> bool:
    """One logging backend for one step; its bool (skip the default logging, in slime) is returned. rlsdk's
    own ``metrics.jsonl`` is written whatever it says. It runs in a thread of its own, waited for at most
    ``args.log_timeout`` seconds (PluginCallError after) and not past ``stop`` (then abandoned: False)."""
    where = f"logging rollout {rollout_id}"
    result = _call_abandonable(resolved, where, args, stop, rollout_id, args, samples, metrics, rollout_time)
    return _log_result(resolved, where, result)


def call_eval_rollout_log(
    resolved: Resolved,
    rollout_id: int,
    args: RunOptions,
    data: dict[str, Any],
    metrics: dict[str, Any],
    *,
    stop: StopRequest | None = None,
) -> bool:
    """One logging backend for one eval (see :func:`call_rollout_log`)."""
    where = f"logging the eval after rollout {rollout_id}"
    return _log_result(
        resolved, where, _call_abandonable(resolved, where, args, stop, rollout_id, args, data, metrics)
    )


def _call_abandonable(
    resolved: Resolved, where: str, args: RunOptions, stop: StopRequest | None, *call_args: Any
) -> Any:
    """:func:`_call_sync` in a daemon thread: a call that hangs past ``args.log_timeout`` is a PluginCallError
    naming it, and one still running when ``stop`` is set is abandoned with a warning (None); either way
    the thread is left behind, and nothing waits for it at exit. With neither, in the caller's thread."""
    timeout = getattr(args, "log_timeout", None)
    if timeout is None and stop is None:  # nothing to wait for: in the caller's thread (slime's calls)
        return _call_sync(resolved, where, *call_args)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = _call_sync(resolved, where, *call_args)
        except BaseException as exc:  # handed back to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=f"rlsdk-{resolved.name}", daemon=True)
    thread.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    while thread.is_alive():
        if stop is not None and stop.is_set:
            warnings.warn(
                f"{resolved.describe()} {where} was still running at {stop.reason}: abandoned",
                RuntimeWarning,
                stacklevel=3,
            )
            return None
        if deadline is not None and time.monotonic() >= deadline:
            raise PluginCallError(
                f"{resolved.describe()} {where} did not return within {timeout:g}s (log_timeout): abandoned"
            )
        thread.join(0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic())))
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def call_checkpoint_callback(resolved: Resolved, args: RunOptions, rollout_id: int, path: Any) -> None:
    """A callback after the checkpoint ``path`` of step ``rollout_id`` is complete."""
    _call_sync(resolved, f"after the checkpoint {path} of rollout {rollout_id}", args, rollout_id, path)


DATA_SOURCE_METHODS = ("get_samples", "add_samples")


def call_data_source(resolved: Resolved, args: RunOptions) -> Any:
    """The data source the plugin builds from ``args``: an object with :data:`DATA_SOURCE_METHODS`."""
    source = _call_sync(resolved, "building the data source", args)
    missing = [m for m in DATA_SOURCE_METHODS if not callable(getattr(source, m, None))]
    if missing:
        raise PluginCallError(
            f"{resolved.describe()} built {type(source).__name__}, which has no {', '.join(missing)}: a data "
            f"source needs get_samples(num_samples) and add_samples(groups)"
        )
    return source


def call_pg_loss_reducer(
    resolved: Resolved,
    total_lengths: list[int],
    response_lengths: list[int],
    loss_masks: list[Any],
    calculate_per_token_loss: bool,
) -> Callable[[Any], Any]:
    """The reducer the plugin builds for one micro-batch; reducing with it is checked for a scalar."""
    where = f"on a micro-batch of {len(response_lengths)} samples"
    reduce = _call_sync(
        resolved, where, total_lengths, response_lengths, loss_masks, calculate_per_token_loss
    )
    if not callable(reduce):
        raise PluginCallError(
            f"{resolved.describe()} {where} returned {type(reduce).__name__}: expected a function"
        )

    def checked(x: Any) -> Any:
        try:
            value = reduce(x)
        except Exception as exc:
            raise _raised(resolved, f"reducing the pg loss {where}", exc) from exc
        if getattr(value, "ndim", None) != 0:
            raise PluginCallError(
                f"{resolved.describe()}'s reducer {where} returned {type(value).__name__} of shape "
                f"{tuple(getattr(value, 'shape', ()))}: expected a scalar tensor"
            )
        return value

    return checked


def call_tis_function(resolved: Resolved, **kwargs: Any) -> tuple[Any, list[Any], dict[str, Any]]:
    """``(pg_loss, loss_masks, metrics)`` from the plugin, called by keyword as slime calls it; the loss keeps
    its shape and the masks one entry per sample."""
    where = f"on a micro-batch of {len(kwargs['response_lengths'])} samples"
    result = _call_sync(resolved, where, **kwargs)
    if not (isinstance(result, tuple) and len(result) == 3):
        raise PluginCallError(
            f"{resolved.describe()} {where} returned {type(result).__name__}: expected (pg_loss, loss_masks, metrics)"
        )
    pg_loss, masks, metrics = result
    if getattr(pg_loss, "shape", None) != kwargs["pg_loss"].shape:
        raise PluginCallError(
            f"{resolved.describe()} {where} returned a pg_loss of shape {tuple(getattr(pg_loss, 'shape', ()))}, "
            f"expected {tuple(kwargs['pg_loss'].shape)}"
        )
    if (
        not isinstance(masks, list)
        or len(masks) != len(kwargs["response_lengths"])
        or not isinstance(metrics, dict)
    ):
        raise PluginCallError(
            f"{resolved.describe()} {where}: expected loss_masks as a list with one tensor per sample and "
            "metrics as a dict"
        )
    return pg_loss, masks, metrics


def call_environment(resolved: Resolved) -> dict[str, Any]:
    """The run options an environment sets (a dict of option names; the caller checks them)."""
    settings = _call_sync(resolved, "giving its settings")
    if not isinstance(settings, dict) or not all(isinstance(k, str) for k in settings):
        raise PluginCallError(
            f"{resolved.describe()} returned {type(settings).__name__}: expected a dict of run options"
        )
    return dict(settings)


# ----- the megatron trainer's hooks and the weight sync's ---------------------------------------------------


def _returns_none(resolved: Resolved, where: str, result: Any) -> None:
    if result is not None:
        raise PluginCallError(
            f"{resolved.describe()} {where} returned {type(result).__name__}: a hook makes its changes in "
            "place and returns None"
        )


def call_megatron_init(resolved: Resolved, args: RunOptions) -> None:
    """The init hook, once megatron's parallel state is set up."""
    where = "after megatron's initialisation"
    _returns_none(resolved, where, _call_sync(resolved, where, args))


def call_megatron_before_log_prob(
    resolved: Resolved, args: RunOptions, model: list[Any], store_prefix: str
) -> None:
    """The hook before a log-prob computation of ``model`` (a list of model chunks); ``store_prefix`` names
    whose log-probs: ``""`` the policy's, ``"ref_"`` the reference model's."""
    where = f"before the {store_prefix.rstrip('_') or 'policy'} log-probs"
    _returns_none(resolved, where, _call_sync(resolved, where, args, model, store_prefix))


def call_megatron_before_train_step(
    resolved: Resolved,
    args: RunOptions,
    rollout_id: int,
    step_id: int,
    model: list[Any],
    optimizer: Any,
    opt_param_scheduler: Any,
) -> None:
    """The hook before optimizer step ``step_id`` of rollout ``rollout_id`` (gradients zeroed)."""
    where = f"before optimizer step {step_id} of rollout {rollout_id}"
    result = _call_sync(resolved, where, args, rollout_id, step_id, model, optimizer, opt_param_scheduler)
    _returns_none(resolved, where, result)


MODEL_METHODS = ("parameters", "state_dict", "load_state_dict")


def call_model_provider(
    resolved: Resolved, *, pre_process: bool, post_process: bool, vp_stage: int | None = None, **extra: Any
) -> Any:
    """The model the provider builds, called by keyword as slime calls it; ``vp_stage`` and ``extra`` (rlsdk's
    ``config``, ``model_kwargs``) are passed where its signature declares them. It must be a torch module."""
    kwargs = {"pre_process": pre_process, "post_process": post_process}
    kwargs.update(_declared(resolved.func, {"vp_stage": vp_stage, **extra}))
    model = _call_sync(resolved, "building the model", **kwargs)
    missing = [m for m in MODEL_METHODS if not callable(getattr(model, m, None))]
    if missing:
        raise PluginCallError(
            f"{resolved.describe()} built {type(model).__name__}, which has no {', '.join(missing)}: a model "
            "provider returns a torch module (a megatron GPTModel)"
        )
    return model


def call_update_weight_post_write(
    resolved: Resolved, args: RunOptions, version_dir: str, rollout_engines: list[Any]
) -> None:
    """The hook after a disk weight sync wrote ``version_dir``, before ``rollout_engines`` read it."""
    where = f"after the weights were written to {version_dir}"
    _returns_none(resolved, where, _call_sync(resolved, where, args, version_dir, rollout_engines))
