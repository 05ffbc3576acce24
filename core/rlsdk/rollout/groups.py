"""One group through generation and reward: the unit the rollout step and eval share."""

from __future__ import annotations

from typing import Any

from ..config import RolloutConfig
from ..aio.concurrency import ConcurrencyLimit, gather_calls
from ..plugins.calls import FINISHED, call_custom_generate, call_sample_hooks
from ..plugins.run_plugins import RunPlugins
from ..types import Sample
from .ledger import Group
from .rewarding import score_group
from ..plugins.kinds import SampleHook


async def run_group(
    args: RolloutConfig,
    plugins: RunPlugins,
    group: Group,
    sampling_params: dict[str, Any],
    limit: ConcurrencyLimit,
    evaluation: bool = False,
    rollout_id: int | None = None,
) -> Group:
    """Generate and reward one group in place. Failures are recorded on the samples, not raised."""
    # custom_generate: each unfinished sample (buffered surplus groups are already complete)
    await generate_group(args, plugins, group, sampling_params, limit, evaluation)
    hooks = plugins.each(SampleHook)
    if hooks and all(s.status in FINISHED for s in group):
        # sample_hook: every finished sample through the hooks, in order, before its reward
        group[:] = await gather_calls(
            [
                call_sample_hooks(hooks, args, s, rollout_id=rollout_id, evaluation=evaluation)
                if s.reward is None
                else _same(s)
                for s in group
            ]
        )
    if all(s.status in FINISHED for s in group) and any(s.reward is None for s in group):
        # reward: per sample, or once per group for group rewards
        await score_group(args, plugins, group, evaluation=evaluation)
    return group


def seeded(args: RolloutConfig, sampling_params: dict[str, Any], position: int) -> dict[str, Any]:
    """Deterministic mode gives sample ``i`` of a group the seed ``rollout_seed + i``."""
    if not args.sglang_enable_deterministic_inference:
        return sampling_params
    return {**sampling_params, "sampling_seed": args.rollout_seed + position}


async def generate_group(
    args: RolloutConfig,
    plugins: RunPlugins,
    group: list[Sample],
    sampling_params: dict[str, Any],
    limit: ConcurrencyLimit,
    evaluation: bool = False,
) -> None:
    """Run custom_generate on every unfinished sample of ``group`` concurrently; the group is updated
    in place (a generator may return several samples for one)."""
    calls = [
        call_custom_generate(
            plugins.generator_for(sample),
            args,
            sample,
            seeded(args, sampling_params, i),
            limit=limit,
            evaluation=evaluation,
        )
        for i, sample in enumerate(group)
    ]
    results = await gather_calls(calls)
    group[:] = [s for produced in results for s in produced]


async def _same(sample: Sample) -> Sample:
    """A sample already rewarded (served again from the buffer): its hooks ran when it was generated."""
    return sample
