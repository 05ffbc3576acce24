"""Eval: every prompt of one or more datasets, each with its own sampling, reward and sample count."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from ..config import RolloutConfig
from ..aio.concurrency import ConcurrencyLimit
from ..data import DataSource
from ..data.eval_sets import run_eval_datasets
from ..plugins.calls import unfinished
from ..plugins.run_plugins import RunPlugins
from ..runtime import Runtime, bind_runtime
from ..types import RolloutFnEvalOutput, Sample, reward_value
from .groups import run_group
from .rewarding import rubric_metrics

log = logging.getLogger(__name__)

EVAL_ATTEMPTS = 3
"""Times an eval group is run before it counts as aborted: a group an engine's death aborted runs again
(from its prompt) once the engines are back."""


def dataset_args(args: RolloutConfig, overrides: dict[str, Any]) -> Any:
    """A copy of ``args`` with one eval dataset's ``overrides`` (rlsdk's config, or slime's ``args``)."""
    if dataclasses.is_dataclass(args) and not isinstance(args, type):
        return dataclasses.replace(args, **overrides)
    copied = copy.copy(args)
    for name, value in overrides.items():
        setattr(copied, name, value)
    return copied


def pass_ks(n: int) -> list[int]:
    """The k of each pass@k for prompts of ``n`` samples: the powers of two up to ``n`` (slime's), and ``n``."""
    return sorted({*(2**i for i in range(n.bit_length())), n}) if n >= 1 else []


def pass_at_k(correct: list[list[bool]], k: int) -> float:
    """Unbiased pass@k over prompts with ``n >= k`` samples each (Chen et al., 2021)."""
    scores = []
    for row in correct:
        n, c = len(row), sum(row)
        if n - c < k:
            scores.append(1.0)
            continue
        miss = 1.0
        for i in range(n - c + 1, n + 1):
            miss *= 1.0 - k / i
        scores.append(1.0 - miss)
    return sum(scores) / len(scores) if scores else 0.0


async def run_eval_groups(
    args: RolloutConfig,
    plugins: RunPlugins,
    groups: list[list[Sample]],
    params: dict[str, Any],
    limit: ConcurrencyLimit,
    name: str,
    progress: Callable[[int], None] = lambda samples: None,
) -> list[list[Sample]]:
    """Generate and reward ``groups`` in place, telling ``progress`` each finished group's size; a group
    aborted mid-generation runs again from its prompt, up to :data:`EVAL_ATTEMPTS` times in all. Returns
    the groups still aborted after that."""
    pristine = copy.deepcopy(groups)
    todo = list(range(len(groups)))

    async def run(group: list[Sample]) -> None:
        await run_group(args, plugins, group, params, limit, evaluation=True)
        progress(len(group))

    for attempt in range(1, EVAL_ATTEMPTS + 1):
        await asyncio.gather(*(run(groups[i]) for i in todo))
        todo = [i for i in todo if unfinished(groups[i])]
        if not todo or attempt == EVAL_ATTEMPTS:
            break
        log.warning("eval %s: %d groups aborted (an engine lost?); running them again", name, len(todo))
        for i in todo:
            groups[i] = copy.deepcopy(pristine[i])
    return [groups[i] for i in todo]


async def eval_rollout(args: RolloutConfig, runtime: Runtime) -> RolloutFnEvalOutput:
    """Generate and reward every prompt of every eval dataset (:func:`rlsdk.data.eval_sets.run_eval_datasets`),
    each with its own settings; no filters, no buffer. pass@k per dataset, with its own sample count."""
    data: dict[str, dict[str, Any]] = {}
    metrics: dict[str, Any] = {}
    for dataset in run_eval_datasets(args):
        n = dataset.n_samples_per_eval_prompt
        ds_args = dataset_args(args, {**dataset.data_options(), "n_samples_per_eval_prompt": n})
        bind_runtime(ds_args, runtime)
        source = DataSource(
            ds_args,
            plugins=runtime.plugins,
            tokenizer=runtime.tokenizer,
            path=dataset.path,
            n_samples_per_prompt=n,
            shuffle=False,
        )
        groups = list(source.iter_groups())
        for sample in (s for group in groups for s in group):
            dataset.stamp(sample)  # its reward, generator and metadata, as slime gives them
        limit = ConcurrencyLimit(ds_args.sglang_server_concurrency)
        name = dataset.name
        aborted = await run_eval_groups(
            ds_args, runtime.plugins, groups, dataset.sampling_params(), limit, name, runtime.report_progress
        )
        rewards = [[reward_value(s.reward, dataset.reward_key) for s in g] for g in groups]
        flat = [r for row in rewards for r in row]
        valid = [r for r in flat if r is not None]
        data[name] = {
            "rewards": flat,
            "truncated": [s.status is Sample.Status.TRUNCATED for g in groups for s in g],
            "samples": [s for g in groups for s in g],
        }
        correct = [[(r or 0.0) > 0 for r in row] for row in rewards]
        metrics[f"eval/{name}/reward_mean"] = sum(valid) / len(valid) if valid else None
        metrics[f"eval/{name}/invalid"] = len(flat) - len(valid)
        metrics[f"eval/{name}/aborted"] = sum(len(group) for group in aborted)
        metrics[f"eval/{name}/prompts"] = len(groups)
        metrics.update(rubric_metrics(data[name]["samples"], f"eval/{name}/rubric/"))
        for k in pass_ks(min((len(row) for row in correct), default=0)):
            metrics[f"eval/{name}/pass@{k}"] = pass_at_k(correct, k)
    return RolloutFnEvalOutput(data=data, metrics=metrics)
