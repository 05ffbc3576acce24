"""Eval: every prompt of one or more datasets, each with its own sampling, reward and sample count."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import warnings
from collections.abc import Callable
from typing import Any

from ..config import RolloutConfig
from ..aio.concurrency import ConcurrencyLimit
from ..data import DataSource
from ..data.eval_sets import EvalDataset, run_eval_datasets
from ..plugins.calls import unfinished
from ..plugins.run_plugins import RunPlugins
from ..runtime import Runtime, bind_runtime
from ..types import RolloutFnEvalOutput, Sample, reward_value
from .groups import run_group
from ..plugins.rubric import RUBRIC_METADATA, parse_rubric
from .rewarding import invalid_reward_causes, rubric_metrics

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


PASS_TOLERANCE = 1e-9
"""How far below the threshold a reward may fall and still pass (a rubric's float sum of its weights)."""


def pass_threshold(dataset: EvalDataset, rm_type: str | None) -> float:
    """The value a sample of ``dataset`` must reach to pass: its ``eval_pass_threshold``, else the maximum of
    what decides: 1 for a reward or a rubric part, the positive weights summed for a rubric's full reward
    (``rm_type``: the dataset's, else the run's)."""
    if dataset.eval_pass_threshold is not None:
        return float(dataset.eval_pass_threshold)
    rubric = None if dataset.eval_pass_key else parse_rubric(rm_type or "")
    return sum(max(part.weight, 0.0) for part in rubric) if rubric else 1.0


def passed(dataset: EvalDataset, sample: Sample, threshold: float) -> bool:
    """Whether ``sample`` passes: its reward under the dataset's reward key, or with ``eval_pass_key`` that
    rubric part (else that dict reward's key), reaches ``threshold``."""
    value = (
        reward_value(sample.reward, dataset.reward_key)
        if dataset.eval_pass_key is None
        else pass_part(sample, dataset.eval_pass_key)
    )
    return isinstance(value, int | float) and value >= threshold - PASS_TOLERANCE


def pass_part(sample: Sample, part: str) -> Any:
    """The value of rubric part (or dict reward key) ``part`` of ``sample``; None where it has none."""
    parts = (sample.metadata or {}).get(RUBRIC_METADATA, {})
    if part in parts:
        return parts[part]
    return sample.reward.get(part) if isinstance(sample.reward, dict) else None


def check_pass_key(part: str | None, samples: list[Sample], name: str) -> None:
    """``eval_pass_key`` must name a rubric part or a dict reward key of eval set ``name``'s samples: else every
    sample would fail without a word."""
    if part is None or not samples or any(pass_part(s, part) is not None for s in samples):
        return
    known = sorted(
        {p for s in samples for p in (s.metadata or {}).get(RUBRIC_METADATA, {})}
        | {k for s in samples if isinstance(s.reward, dict) for k in s.reward}
    )
    raise ValueError(
        f"eval_pass_key {part!r}: no sample of eval set {name!r} has that rubric part or reward key "
        f"(it has: {', '.join(known) or 'none: its reward is one number'})"
    )


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
        check_pass_key(dataset.eval_pass_key, data[name]["samples"], name)
        threshold = pass_threshold(dataset, dataset.rm_type or getattr(args, "rm_type", None))
        correct = [[passed(dataset, s, threshold) for s in g] for g in groups]
        metrics[f"eval/{name}/reward_mean"] = sum(valid) / len(valid) if valid else None
        metrics[f"eval/{name}/invalid"] = len(flat) - len(valid)
        metrics[f"eval/{name}/failed"] = sum(GENERATE_ERROR in s.metadata for s in data[name]["samples"])
        warn_unscored(name, data[name]["samples"], len(flat) - len(valid))
        metrics[f"eval/{name}/aborted"] = sum(len(group) for group in aborted)
        metrics[f"eval/{name}/prompts"] = len(groups)
        metrics.update(rubric_metrics(data[name]["samples"], f"eval/{name}/rubric/"))
        for k in pass_ks(min((len(row) for row in correct), default=0)):
            metrics[f"eval/{name}/pass@{k}"] = pass_at_k(correct, k)
        metrics[f"eval/{name}/pass_threshold"] = threshold
    return RolloutFnEvalOutput(data=data, metrics=metrics)


GENERATE_ERROR = "generate_error"
"""Metadata key of a sample whose generation failed (the engine's error, a hung or raising generator)."""
SHOWN_CAUSES = 3
"""Distinct causes the warning on an eval's unscored samples quotes."""


def warn_unscored(name: str, samples: list[Sample], unscored: int) -> None:
    """Warn of eval samples that failed or got an invalid reward, with their causes: a score computed
    without them should not pass unnoticed."""
    if not unscored:
        return
    failed = [s.metadata[GENERATE_ERROR] for s in samples if GENERATE_ERROR in s.metadata]
    invalid = invalid_reward_causes([s for s in samples if GENERATE_ERROR not in s.metadata])
    parts = []
    if failed:
        parts.append(f"{len(failed)} failed ({quoted(failed)})")
    if unscored > len(failed):
        parts.append(
            f"{unscored - len(failed)} got no valid reward ({quoted(invalid) or 'aborted, not scored'})"
        )
    warnings.warn(
        f"eval {name}: {' and '.join(parts)} of {len(samples)} samples: reward_mean leaves them out, pass@k "
        "counts them wrong (their rows are in eval_samples.jsonl)",
        stacklevel=2,
    )


def quoted(causes: list[str]) -> str:
    """The first :data:`SHOWN_CAUSES` distinct ``causes``, and how many more there are."""
    distinct = list(dict.fromkeys(causes))
    more = f"; {len(distinct) - SHOWN_CAUSES} more" if len(distinct) > SHOWN_CAUSES else ""
    return "; ".join(distinct[:SHOWN_CAUSES]) + more
