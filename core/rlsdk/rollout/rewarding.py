"""Scoring samples with reward plugins, shared by the rollout loop and ``rlsdk score``.

Each sample's reward is chosen as slime chooses it: ``sample.custom_rm_path``, then ``args.custom_rm_path``
(a group reward with ``args.group_rm``), then ``sample.metadata["rm_type"]``, then ``args.rm_type``. A name
``boxed_X`` that no plugin registers means reward ``X`` applied to the last ``\\boxed{}`` of the response
(empty when there is none), so the prefix works for every reward, third-party ones included.

A reward that raises, hangs past ``args.reward_timeout`` or returns something other than a number or a
dict never becomes a silent 0: the sample is marked invalid (``reward=None``, status ``failed``, the reason
in ``metadata["reward_error"]``), and :func:`apply_invalid_policy` applies ``args.on_invalid_reward``.

Rewards are resolved once per run (:class:`rlsdk.plugins.run_plugins.RunPlugins`) and called through
:func:`rlsdk.plugins.calls.call_reward` (async ones on the event loop, plain ones in a thread of
:mod:`rlsdk.aio.blocking`'s pool or as Ray tasks, ``cheap`` ones inline).
"""

from __future__ import annotations

from typing import Any

from ..config import RolloutConfig
from ..aio.concurrency import gather_calls
from ..errors import PluginCallError, PluginError
from ..plugins.calls import InvalidReward, call_cheap_reward, call_reward
from ..plugins.records import Resolved
from ..plugins.rubric import RUBRIC_METADATA
from ..plugins.run_plugins import RunPlugins
from ..runtime import plugins_of
from ..types import Sample

REWARD_ERROR = "reward_error"
"""Metadata key holding why a sample's reward is invalid (it stays after ``on_invalid_reward=score``)."""
_STATUS_BEFORE = "status_before_reward_error"
INVALID_DROP_REASON = "invalid_reward"


# ----- resolution -----------------------------------------------------------------------------------


def reward_spec(args: RolloutConfig, sample: Sample) -> tuple[str, bool]:
    """(reward name or path, is group reward) for one sample, in slime's order of precedence."""
    if sample.custom_rm_path:
        return sample.custom_rm_path, False
    custom: str | None = getattr(args, "custom_rm_path", None)  # slime's own args may lack rlsdk's options
    if custom:
        return custom, bool(getattr(args, "group_rm", False))
    rm_type = (sample.metadata or {}).get("rm_type") or getattr(args, "rm_type", None)
    if not rm_type:
        raise PluginError(f"sample {_where(sample)} has no reward: set rm_type (--rm) or custom_rm_path")
    return rm_type, False


# ----- scoring --------------------------------------------------------------------------------------


async def score_group(
    args: RolloutConfig,
    plugins: RunPlugins,
    samples: list[Sample],
    *,
    evaluation: bool = False,
) -> None:
    """Set ``reward`` on every sample that has none (a group reward scores every sample), marking
    invalid ones; never raises for one bad sample. Rewards come from the run's ``plugins``.

    Raises PluginError only for configuration errors: an unknown reward (before any reward runs), or a
    dict reward without the configured ``reward_key``/``eval_reward_key``.
    """
    plan: dict[tuple[str, bool], tuple[Resolved, list[Sample]]] = {}  # samples by reward
    for sample in samples:
        spec = reward_spec(args, sample)
        if sample.reward is not None and not spec[1]:
            continue  # a custom generator already scored it (slime's agents do): kept, as slime keeps it
        if spec not in plan:
            plan[spec] = (plugins.resolve("reward", spec[0], group=spec[1]), [])
        plan[spec][1].append(sample)
    timeout = float(getattr(args, "reward_timeout", 60.0))
    calls = []
    for resolved, members in plan.values():
        if resolved.record.group:
            calls.append(_score(args, plugins, resolved, members, evaluation, timeout))
        elif resolved.record.cheap:
            _score_inline(args, resolved, members, evaluation)
        else:
            calls.extend(_score(args, plugins, resolved, s, evaluation, timeout) for s in members)
    if calls:
        await gather_calls(calls)
    key = (
        (getattr(args, "eval_reward_key", None) or getattr(args, "reward_key", None))
        if evaluation
        else getattr(args, "reward_key", None)
    )
    if key is not None:
        for sample in samples:
            _check_key(args, plugins, sample, key)


async def score_samples(args: RolloutConfig, samples: list[Sample], *, evaluation: bool = False) -> None:
    """Score ``samples`` with the run's rewards, as the rollout step does (for a plugin that scores samples
    itself, such as slime's ``batched_async_rm``): each sample without a reward gets one, or is marked
    invalid with the reason in ``metadata[REWARD_ERROR]``."""
    await score_group(args, plugins_of(args), samples, evaluation=evaluation)


def _score_inline(args: RolloutConfig, resolved: Resolved, samples: list[Sample], evaluation: bool) -> None:
    """A ``cheap`` reward, called on the event loop: no thread hop, no timeout."""
    for sample in samples:
        try:
            reward = call_cheap_reward(resolved, args, sample, evaluation=evaluation)
        except InvalidReward as exc:
            mark_invalid(sample, resolved, exc.reason)
            continue
        _set(sample, resolved, reward)


async def _score(
    args: RolloutConfig,
    plugins: RunPlugins,
    resolved: Resolved,
    target: Sample | list[Sample],
    evaluation: bool,
    timeout: float,
) -> None:
    """One reward call: on one sample, or (``target`` a list, a group reward) on a group's samples at once."""
    samples = target if isinstance(target, list) else [target]
    try:
        result = await call_reward(
            resolved, args, target, evaluation=evaluation, timeout=timeout, runner=plugins.reward_runner
        )
    except InvalidReward as exc:
        for sample in samples:
            mark_invalid(sample, resolved, exc.reason)
        return
    for sample, reward in zip(samples, result if isinstance(target, list) else [result], strict=True):
        _set(sample, resolved, reward)


def _set(sample: Sample, resolved: Resolved, reward: Any) -> None:
    if reward is None:
        mark_invalid(sample, resolved, "returned None (the reward marks the sample invalid)")
    else:
        sample.reward = reward


def _check_key(args: RolloutConfig, plugins: RunPlugins, sample: Sample, key: str | None) -> None:
    if key is None or not isinstance(sample.reward, dict) or key in sample.reward:
        return
    spec, group = reward_spec(args, sample)
    raise PluginError(
        f"{plugins.resolve('reward', spec, group=group).describe()} returned a dict with keys "
        f"{sorted(sample.reward)} for sample {_where(sample)}, which has no reward key {key!r}: "
        f"choose one of them with --reward-key/--eval-reward-key"
    )


def _where(sample: Sample) -> str:
    return f"group_index={sample.group_index} index={sample.index}"


# ----- invalid samples --------------------------------------------------------------------------------


def mark_invalid(sample: Sample, resolved: Resolved, reason: str) -> None:
    """Mark a sample's reward invalid: ``reward=None``, status failed, the reason in its metadata."""
    if sample.metadata is None:
        sample.metadata = {}
    sample.metadata.setdefault(_STATUS_BEFORE, Sample.Status(sample.status).value)
    sample.reward = None
    sample.status = Sample.Status.FAILED
    sample.metadata[REWARD_ERROR] = f"{resolved.describe()} on sample {_where(sample)}: {reason}"


def has_unhandled_invalid_reward(sample: Sample) -> bool:
    """Whether the sample's reward is invalid and not yet handled by :func:`apply_invalid_policy`."""
    return sample.reward is None and REWARD_ERROR in (sample.metadata or {})


def count_invalid(samples: list[Sample]) -> int:
    """Samples whose reward was invalid (including ones later scored by ``on_invalid_reward=score``)."""
    return sum(REWARD_ERROR in (s.metadata or {}) for s in samples)


def invalid_reward_causes(samples: list[Sample]) -> list[str]:
    """The distinct causes of the samples' invalid rewards (the reward and the reason, without the sample)."""
    causes = (
        s.metadata[REWARD_ERROR].replace(f" on sample {_where(s)}", "", 1)
        for s in samples
        if REWARD_ERROR in (s.metadata or {})
    )
    return list(dict.fromkeys(causes))


def apply_invalid_policy(args: RolloutConfig, group: list[Sample]) -> str | None:
    """Apply ``args.on_invalid_reward`` to a scored group holding invalid samples.

    ``fail`` raises PluginCallError with the reasons; ``drop_group`` returns the drop reason
    ``"invalid_reward"``; ``score`` gives invalid samples ``args.invalid_reward_value`` and their status
    back. Returns None when the group is kept.
    """
    invalid = [s for s in group if s.reward is None and has_unhandled_invalid_reward(s)]
    if not invalid:
        return None
    policy = getattr(args, "on_invalid_reward", "drop_group")
    if policy == "fail":
        reasons = "; ".join(s.metadata[REWARD_ERROR] for s in invalid[:3])
        more = f" (and {len(invalid) - 3} more)" if len(invalid) > 3 else ""
        raise PluginCallError(
            f"{len(invalid)} invalid reward(s): {reasons}{more}. on_invalid_reward=fail stops the run; "
            f"use drop_group or score to continue"
        )
    if policy == "drop_group":
        return INVALID_DROP_REASON
    if policy == "score":
        for sample in invalid:
            sample.reward = float(getattr(args, "invalid_reward_value", 0.0))
            sample.status = Sample.Status(sample.metadata.pop(_STATUS_BEFORE, Sample.Status.COMPLETED.value))
        return None
    raise PluginError(f"on_invalid_reward must be fail, drop_group or score, got {policy!r}")


def rubric_metrics(samples: list[Sample], prefix: str) -> dict[str, float]:
    """The mean of each rubric part over the samples a rubric scored: ``<prefix><part>``."""
    values: dict[str, list[float]] = {}
    for sample in samples:
        for part, value in (sample.metadata or {}).get(RUBRIC_METADATA, {}).items():
            values.setdefault(part, []).append(value)
    return {f"{prefix}{part}": sum(v) / len(v) for part, v in values.items()}
