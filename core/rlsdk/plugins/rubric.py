"""Rubrics: a weighted sum of rewards, named ``a:0.7,b:0.3`` wherever a reward is (``--rm``, an environment).

Each part is a reward plugin (a name or a dotted path; a dict reward's ``reward_key`` value is used). The
sample's reward is the weighted sum; each part's value lands in ``sample.metadata["rubric"]`` so the step
logs it as its own metric (``rollout/rubric/<part>``). A part that raises, hangs or returns something
that is not a reward makes the sample invalid, naming the part: never a silent 0. A rubric with a group
reward among its parts is itself a group reward (a failing part then invalidates the whole group).
"""

from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass
from typing import Any

from ..types import Sample, reward_value
from .calls import InvalidReward, call_reward
from .kinds import Reward
from .records import PluginInfo, Resolved
from ..options import RunOptions


WEIGHT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
"""A rubric weight: a decimal number (never ``nan``, ``inf``, ``1_0``: those are names)."""
RUBRIC_METADATA = "rubric"
"""Sample metadata key: ``{part name: value}`` of a rubric's parts."""


@dataclass(frozen=True)
class RubricPart:
    spec: str
    weight: float


def parse_rubric(spec: str) -> list[RubricPart] | None:
    """The parts of ``"a:0.7,b:0.3"`` (a lone ``"a:1"`` too); None when ``spec`` is not a rubric (a reward
    name, or a dotted path ``pkg.mod:fn``)."""
    parts = []
    for item in spec.split(","):
        name, sep, weight = item.strip().rpartition(":")
        if not sep or not name.strip() or not WEIGHT.fullmatch(weight.strip()):
            return None  # ``pkg.mod:nan`` names a function ``nan``: a weight is a decimal number
        value = float(weight)
        if not math.isfinite(value):
            raise ValueError(f"rubric {spec!r}: the weight of {name.strip()!r} is not a finite number")
        parts.append(RubricPart(name.strip(), value))
    names = [p.spec for p in parts]
    if len(set(names)) != len(names):
        raise ValueError(f"rubric {spec!r} names a reward twice")
    return parts


def rubric_reward(spec: str, parts: list[tuple[RubricPart, Resolved[Any]]]) -> Resolved[Any]:
    """A resolved reward computing the weighted sum of ``parts`` (each resolved already)."""
    group = any(resolved.record.group for _, resolved in parts)

    async def score_one(args: RunOptions, sample: Sample, evaluation: bool, values: dict[str, float]) -> None:
        for part, resolved in parts:
            if not resolved.record.group:
                values[part.spec] = _scalar(
                    args, resolved, sample, await _call(args, resolved, sample, evaluation)
                )

    async def rubric(args: RunOptions, target: Any, evaluation: bool = False) -> Any:
        samples = target if group else [target]
        values: list[dict[str, float]] = [{} for _ in samples]
        for part, resolved in parts:
            if resolved.record.group:
                rewards = await _call(args, resolved, samples, evaluation)
                for sample, value, row in zip(samples, rewards, values, strict=True):
                    row[part.spec] = _scalar(args, resolved, sample, value)
        await asyncio.gather(
            *(score_one(args, s, evaluation, row) for s, row in zip(samples, values, strict=True))
        )
        totals = []
        for sample, row in zip(samples, values, strict=True):
            sample.metadata[RUBRIC_METADATA] = row
            totals.append(sum(part.weight * row[part.spec] for part, _ in parts))
        return totals if group else totals[0]

    record = Reward(
        name="rubric",
        func=rubric,
        description=" + ".join(f"{p.weight:g} x {r.name}" for p, r in parts),
        group=group,
    )
    return Resolved(record, PluginInfo(plugin=f"rubric {spec}"), is_async=True, accepts_evaluation=True)


async def _call(args: RunOptions, resolved: Resolved[Any], target: Any, evaluation: bool) -> Any:
    """One part's reward; its failure names the part (the sample's error names the rubric too)."""
    timeout = getattr(args, "reward_timeout", None)
    try:
        return await call_reward(resolved, args, target, evaluation=evaluation, timeout=timeout)
    except InvalidReward as exc:
        raise InvalidReward(resolved, "(a rubric part)", f"part {resolved.describe()}: {exc.reason}") from exc


def _scalar(args: RunOptions, resolved: Resolved[Any], sample: Sample, value: Any) -> float:
    """A part's value as a number: None (the part marks the sample invalid) and a dict without the run's
    ``reward_key`` are invalid rewards naming the part."""
    where = f"on sample {sample.group_index}/{sample.index} (a rubric part)"
    part = f"part {resolved.describe()}"
    if value is None:
        raise InvalidReward(resolved, where, f"{part} returned None (the reward marks the sample invalid)")
    try:
        scalar = reward_value(value, getattr(args, "reward_key", None))
    except KeyError as exc:
        raise InvalidReward(resolved, where, f"{part}: {exc.args[0]}") from None
    if scalar is None:
        raise InvalidReward(resolved, where, f"{part} returned a dict whose reward key is None")
    return scalar
