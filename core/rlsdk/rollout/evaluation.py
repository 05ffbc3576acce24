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
from ..plugins.calls import unfinished
from ..plugins.run_plugins import RunPlugins
from ..runtime import Runtime, bind_runtime
from ..types import RolloutFnEvalOutput, Sample, reward_value
from .generate import sampling_params_for
from .groups import run_group
from ..plugins.rubric import RUBRIC_METADATA, parse_rubric
from .rewarding import rubric_metrics

log = logging.getLogger(__name__)

EVAL_ATTEMPTS = 3
"""Times an eval group is run before it counts as aborted: a group an engine's death aborted runs again
(from its prompt) once the engines are back."""

DATASET_OVERRIDES = (
    "rm_type",
    "custom_rm_path",
    "n_samples_per_eval_prompt",
    "eval_temperature",
    "eval_top_p",
    "eval_max_response_len",
    "eval_reward_key",
    "reward_key",
    "eval_pass_key",
    "eval_pass_threshold",
    "input_key",
    "label_key",
    "tool_key",
    "metadata_key",
    "apply_chat_template",
    "apply_chat_template_kwargs",
    "rollout_top_k",
    "rollout_stop",
    "rollout_stop_token_ids",
    "rollout_skip_special_tokens",
    "custom_generate_function_path",
)
SLIME_EVAL_FIELDS = {
    "temperature": "eval_temperature",
    "top_p": "eval_top_p",
    "max_response_len": "eval_max_response_len",
    "top_k": "rollout_top_k",
    "stop": "rollout_stop",
    "stop_token_ids": "rollout_stop_token_ids",
    "skip_special_tokens": "rollout_skip_special_tokens",
}
"""slime's ``EvalDatasetConfig`` fields under rlsdk's option names (the others it shares are named alike)."""


def eval_datasets(args: RolloutConfig) -> list[dict[str, Any]]:
    """``args.eval_datasets`` (dicts, or slime's ``EvalDatasetConfig`` objects) plus slime's flat
    ``eval_prompt_data`` (``name path name path ...``)."""
    datasets = [as_dataset_dict(d) for d in args.eval_datasets or []]
    flat = list(args.eval_prompt_data or [])
    if len(flat) % 2:
        raise ValueError(f"eval_prompt_data takes name/path pairs, got {flat!r}")
    known = {d["name"] for d in datasets if "name" in d}
    pairs = zip(flat[::2], flat[1::2], strict=True)
    datasets += [{"name": name, "path": path} for name, path in pairs if name not in known]
    for d in datasets:
        if "name" not in d or "path" not in d:
            raise ValueError(f"an eval dataset needs a name and a path, got {d!r}")
        unknown = set(d) - {"name", "path", *DATASET_OVERRIDES}
        if unknown:
            raise ValueError(f"eval dataset {d['name']!r}: unknown options {sorted(unknown)}")
    return datasets


def as_dataset_dict(spec: Any) -> dict[str, Any]:
    """An eval dataset as a dict of rlsdk's options: a dict as it is; slime's ``EvalDatasetConfig`` by its set
    fields (renamed, :data:`SLIME_EVAL_FIELDS`). A field rlsdk does not implement, when set, is an error."""
    if isinstance(spec, dict):
        return dict(spec)
    if not dataclasses.is_dataclass(spec) or isinstance(spec, type):
        raise ValueError(f"an eval dataset is a dict or slime's EvalDatasetConfig, got {type(spec).__name__}")
    values = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    named = {SLIME_EVAL_FIELDS.get(k, k): v for k, v in values.items() if v is not None and v != {}}
    unsupported = sorted(set(named) - {"name", "path", *DATASET_OVERRIDES})
    if unsupported:
        raise ValueError(
            f"eval dataset {values.get('name')!r}: rlsdk's eval does not implement {unsupported} of slime's "
            "EvalDatasetConfig (unset them, or name an eval function that does)"
        )
    return named


def dataset_args(args: RolloutConfig, overrides: dict[str, Any]) -> Any:
    """A copy of ``args`` with one eval dataset's ``overrides`` (rlsdk's config, or slime's ``args``)."""
    if dataclasses.is_dataclass(args) and not isinstance(args, type):
        return dataclasses.replace(args, **overrides)
    copied = copy.copy(args)
    for name, value in overrides.items():
        setattr(copied, name, value)
    return copied


PASS_TOLERANCE = 1e-9
"""How far below the threshold a reward may fall and still pass (a rubric's float sum of its weights)."""


def pass_threshold(args: Any) -> float:
    """The value a sample must reach to pass: ``eval_pass_threshold``, else the maximum of what decides: 1
    for a reward or a rubric part, the positive weights summed for a rubric's full reward."""
    if args.eval_pass_threshold is not None:
        return float(args.eval_pass_threshold)
    rubric = None if args.eval_pass_key else parse_rubric(getattr(args, "rm_type", None) or "")
    return sum(max(part.weight, 0.0) for part in rubric) if rubric else 1.0


def passed(args: Any, sample: Sample, key: str | None, threshold: float) -> bool:
    """Whether ``sample`` passes: its reward under ``key`` (the eval's reward key), or with ``eval_pass_key``
    that rubric part (else that dict reward's key), reaches ``threshold``."""
    value = (
        reward_value(sample.reward, key)
        if args.eval_pass_key is None
        else pass_part(sample, args.eval_pass_key)
    )
    return isinstance(value, int | float) and value >= threshold - PASS_TOLERANCE


def pass_part(sample: Sample, part: str) -> Any:
    """The value of rubric part (or dict reward key) ``part`` of ``sample``; None where it has none."""
    parts = (sample.metadata or {}).get(RUBRIC_METADATA, {})
    if part in parts:
        return parts[part]
    return sample.reward.get(part) if isinstance(sample.reward, dict) else None


def check_pass_key(args: Any, samples: list[Sample], name: str) -> None:
    """``eval_pass_key`` must name a rubric part or a dict reward key of eval set ``name``'s samples: else every
    sample would fail without a word."""
    part = args.eval_pass_key
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
    """Generate and reward every prompt of every eval dataset; no filters, no buffer."""
    data: dict[str, dict[str, Any]] = {}
    metrics: dict[str, Any] = {}
    for spec in eval_datasets(args):
        overrides = {k: v for k, v in spec.items() if k in DATASET_OVERRIDES}
        ds_args = dataset_args(args, overrides)
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
        aborted = await run_eval_groups(
            ds_args, runtime.plugins, groups, params, limit, name, runtime.report_progress
        )
        key = ds_args.eval_reward_key or ds_args.reward_key
        rewards = [[reward_value(s.reward, key) for s in g] for g in groups]
        flat = [r for row in rewards for r in row]
        valid = [r for r in flat if r is not None]
        data[name] = {
            "rewards": flat,
            "truncated": [s.status is Sample.Status.TRUNCATED for g in groups for s in g],
            "samples": [s for g in groups for s in g],
        }
        check_pass_key(ds_args, data[name]["samples"], name)
        threshold = pass_threshold(ds_args)
        correct = [[passed(ds_args, s, key, threshold) for s in g] for g in groups]
        metrics[f"eval/{name}/reward_mean"] = sum(valid) / len(valid) if valid else None
        metrics[f"eval/{name}/invalid"] = len(flat) - len(valid)
        metrics[f"eval/{name}/aborted"] = sum(len(group) for group in aborted)
        metrics[f"eval/{name}/prompts"] = len(groups)
        metrics.update(rubric_metrics(data[name]["samples"], f"eval/{name}/rubric/"))
        for k in sorted({1, n}):
            metrics[f"eval/{name}/pass@{k}"] = pass_at_k(correct, k)
        metrics[f"eval/{name}/pass_threshold"] = threshold
    return RolloutFnEvalOutput(data=data, metrics=metrics)
