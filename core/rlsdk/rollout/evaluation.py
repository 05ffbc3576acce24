"""Eval: every prompt of one or more datasets, each with its own sampling, reward and sample count."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
from typing import Any

from ..config import RolloutConfig
from ..aio.concurrency import ConcurrencyLimit
from ..data import DataSource
from ..plugins.calls import unfinished
from ..plugins.run_plugins import RunPlugins
from ..runtime import Runtime, bind_runtime
from ..types import RolloutFnEvalOutput, Sample, reward_value
from .generate import sampling_params_for
from .groups import run_group

log = logging.getLogger(__name__)

EVAL_ATTEMPTS = 3
"""Times an eval group is run before it counts as aborted: a group an engine's death aborted runs again
(from its prompt) once the engines are back."""

DATASET_OVERRIDES = (
    "rm_type",
    "n_samples_per_eval_prompt",
    "eval_temperature",
    "eval_top_p",
    "eval_max_response_len",
    "eval_reward_key",
    "reward_key",
    "input_key",
    "label_key",
)


def eval_datasets(args: RolloutConfig) -> list[dict[str, Any]]:
    """``args.eval_datasets`` plus slime's flat ``eval_prompt_data`` (``name path name path ...``)."""
    datasets = [dict(d) for d in args.eval_datasets]
    flat = list(args.eval_prompt_data)
    if len(flat) % 2:
        raise ValueError(f"eval_prompt_data takes name/path pairs, got {flat!r}")
    datasets += [{"name": name, "path": path} for name, path in zip(flat[::2], flat[1::2], strict=True)]
    for d in datasets:
        if "name" not in d or "path" not in d:
            raise ValueError(f"an eval dataset needs a name and a path, got {d!r}")
        unknown = set(d) - {"name", "path", *DATASET_OVERRIDES}
        if unknown:
            raise ValueError(f"eval dataset {d['name']!r}: unknown options {sorted(unknown)}")
    return datasets


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
) -> list[list[Sample]]:
    """Generate and reward ``groups`` in place; a group aborted mid-generation runs again from its prompt,
    up to :data:`EVAL_ATTEMPTS` times in all. Returns the groups still aborted after that."""
    pristine = copy.deepcopy(groups)
    todo = list(range(len(groups)))
    for attempt in range(1, EVAL_ATTEMPTS + 1):
        await asyncio.gather(
            *(run_group(args, plugins, groups[i], params, limit, evaluation=True) for i in todo)
        )
        todo = [i for i in todo if unfinished(groups[i])]
        if not todo or attempt == EVAL_ATTEMPTS:
            break
        log.warning("eval %s: %d groups aborted (an engine lost?); running them again", name, len(todo))
        for i in todo:
            groups[i] = copy.deepcopy(pristine[i])
    return [groups[i] for i in todo]


async def eval_rollout(args: RolloutConfig, runtime: Runtime) -> RolloutFnEvalOutput:
    """Generate and reward every prompt of every eval dataset; no filters, no buffer."""
    data: dict[str, dict[str, Any]] = {}
    metrics: dict[str, Any] = {}
    for spec in eval_datasets(args):
        overrides = {k: v for k, v in spec.items() if k in DATASET_OVERRIDES}
        ds_args = dataclasses.replace(args, **overrides)
        bind_runtime(ds_args, runtime)
        n = ds_args.n_samples_per_eval_prompt
        source = DataSource(
            ds_args,
            plugins=runtime.plugins,
            tokenizer=runtime.tokenizer,
            path=spec["path"],
            n_samples_per_prompt=n,
            shuffle=False,
        )
        groups = list(source.iter_groups())
        params = sampling_params_for(ds_args, evaluation=True)
        limit = ConcurrencyLimit(ds_args.sglang_server_concurrency)
        name = spec["name"]
        aborted = await run_eval_groups(ds_args, runtime.plugins, groups, params, limit, name)
        key = ds_args.eval_reward_key or ds_args.reward_key
        rewards = [[reward_value(s.reward, key) for s in g] for g in groups]
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
        for k in sorted({1, n}):
            metrics[f"eval/{name}/pass@{k}"] = pass_at_k(correct, k)
    return RolloutFnEvalOutput(data=data, metrics=metrics)
