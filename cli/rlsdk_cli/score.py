"""``rlsdk score``: add a reward to every line of a JSONL file with any reward plugin."""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rlsdk import RolloutConfig, Sample, get_plugin_manager
from rlsdk.errors import PluginError
from rlsdk.plugins.run_plugins import RunPlugins
from rlsdk.rollout.rewarding import REWARD_ERROR, score_group
from rlsdk.types import reward_value

CHUNK_LINES = 256
"""Lines read and scored together (rewards of a chunk run concurrently)."""


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                yield number, line


def _sample(row: Any, number: int, keys: dict[str, str]) -> Sample:
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    if keys["response"] not in row:
        raise ValueError(f"no {keys['response']!r} field (fields: {sorted(row)})")
    metadata = row.get(keys["metadata"]) or {}
    if not isinstance(metadata, dict):
        raise ValueError(f"{keys['metadata']!r} must be an object, got {type(metadata).__name__}")
    response = row[keys["response"]]
    if not isinstance(response, str):
        raise ValueError(f"{keys['response']!r} must be a string, got {type(response).__name__}")
    group_index = row.get("group_index")
    return Sample(
        group_index=group_index if isinstance(group_index, int) else None,
        index=number,
        prompt=row.get(keys["prompt"], ""),
        response=response,
        label=row.get(keys["label"]),
        metadata=dict(metadata),
        status=Sample.Status.COMPLETED,
    )


def _groups(samples: list[tuple[dict[str, Any], Sample]]) -> list[list[tuple[dict[str, Any], Sample]]]:
    """Consecutive lines with the same ``group_index`` form a group (for group rewards)."""
    groups: list[list[tuple[dict[str, Any], Sample]]] = []
    for item in samples:
        gi = item[1].group_index
        if groups and gi is not None and groups[-1][-1][1].group_index == gi:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def score(
    rm: str = typer.Option(..., "--rm", help="Reward: a registered name, boxed_<name>, or a dotted path."),
    input_path: Path = typer.Option(..., "--input", "-i", exists=True, dir_okay=False, help="Input JSONL."),
    output_path: Path = typer.Option(..., "--output", "-o", dir_okay=False, help="Output JSONL."),
    response_key: str = typer.Option("response", help="Field holding the response."),
    label_key: str = typer.Option("label", help="Field holding the label."),
    metadata_key: str = typer.Option("metadata", help="Field holding per-line metadata."),
    prompt_key: str = typer.Option("prompt", help="Field holding the prompt."),
    reward_key: str | None = typer.Option(None, help="Key of dict rewards averaged in the summary."),
    rm_url: str | None = typer.Option(None, help="URL for the remote reward."),
    group_rm: bool = typer.Option(
        False, help="Call a dotted-path reward once per group (lines sharing group_index)."
    ),
    workers: int | None = typer.Option(None, min=1, help="Grading worker processes (default min(4, CPUs))."),
    timeout: float = typer.Option(
        60.0,
        min=0.001,
        help="Seconds a sample's reward may take before it is invalid (also caps grading in a worker).",
    ),
    on_error: str = typer.Option(
        "skip",
        help="A malformed line: 'skip' reports it and goes on, 'stop' stops (lines scored so far are kept).",
    ),
) -> None:
    """Score a JSONL file: each line gets `reward` (a number, a dict, or null with `reward_error`)."""
    if on_error not in ("skip", "stop"):
        raise typer.BadParameter(f"--on-error must be skip or stop, got {on_error!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = get_plugin_manager()
    given = {
        "rm_type": rm,
        "reward_key": reward_key,
        "reward_timeout": timeout,
        "rm_url": rm_url,
        "grader_workers": workers,
    }  # the last two are rm_hub's options
    args = RolloutConfig.from_dict({k: v for k, v in given.items() if v is not None}, pm=pm)
    if "grader_timeout" in args.extra:  # grading in a worker stops within the reward's own timeout
        args = args.replace(grader_timeout=min(timeout, args.extra["grader_timeout"]))
    if group_rm:
        args = args.replace(rm_type=rm, custom_rm_path=rm, group_rm=True)
    err = Console(stderr=True)
    plugins = RunPlugins(args, pm)
    try:
        plugins.reward  # noqa: B018 (a wrong name fails before any line is read)
    except PluginError as exc:
        err.print(f"Error: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    keys = {"response": response_key, "label": label_key, "metadata": metadata_key, "prompt": prompt_key}
    total_lines = sum(1 for _ in _lines(input_path)) if err.is_terminal else None
    stats = {"count": 0, "invalid": 0, "malformed": 0, "sum": 0.0, "scalars": 0}
    started = time.perf_counter()
    progress = Progress(
        TextColumn("scoring"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=not err.is_terminal,
        transient=True,
    )
    stopped = False
    with progress, output_path.open("w", encoding="utf-8") as out:
        task = progress.add_task("score", total=total_lines)
        chunk: list[tuple[dict[str, Any], Sample]] = []
        for number, line in _lines(input_path):
            try:
                row = json.loads(line)
                chunk.append((row, _sample(row, number, keys)))
            except ValueError as exc:
                stats["malformed"] += 1
                err.print(
                    f"{input_path}:{number}: malformed line: {exc}",
                    markup=False,
                    highlight=False,
                    soft_wrap=True,
                )
                if on_error == "stop":
                    stopped = True
                    break
            if len(chunk) >= CHUNK_LINES:
                _flush(args, plugins, chunk, out, stats, reward_key)
                progress.advance(task, len(chunk))
                chunk = []
        _flush(args, plugins, chunk, out, stats, reward_key)
        progress.advance(task, len(chunk))
    elapsed = time.perf_counter() - started
    mean = stats["sum"] / stats["scalars"] if stats["scalars"] else float("nan")
    summary = {
        "count": stats["count"],
        "mean": None if math.isnan(mean) else round(mean, 6),
        "invalid": stats["invalid"],
        "malformed": stats["malformed"],
        "seconds": round(elapsed, 3),
    }
    Console(soft_wrap=True).print(
        f"scored {summary['count']} lines with {rm!r}: mean {summary['mean']}, "
        f"invalid {summary['invalid']}, malformed {summary['malformed']}, "
        f"{summary['seconds']}s -> {output_path}",
        markup=False,
        highlight=False,
    )
    if stopped:
        raise typer.Exit(1)


def _flush(
    args: RolloutConfig,
    plugins: RunPlugins,
    chunk: list[tuple[dict[str, Any], Sample]],
    out: Any,
    stats: dict[str, Any],
    reward_key: str | None,
) -> None:
    if not chunk:
        return

    async def run() -> None:
        await asyncio.gather(*(score_group(args, plugins, [s for _, s in group]) for group in _groups(chunk)))

    try:
        asyncio.run(run())
    except PluginError as exc:
        Console(stderr=True).print(f"Error: {exc}", markup=False, highlight=False)
        raise typer.Exit(2) from None
    for row, sample in chunk:
        row = dict(row)
        row["reward"] = sample.reward
        error = sample.metadata.get(REWARD_ERROR)
        if error:
            row["reward_error"] = error
            stats["invalid"] += 1
        else:
            try:
                value = reward_value(sample.reward, reward_key)
            except KeyError:
                value = None  # a dict reward without --reward-key: written, not averaged
            if value is not None:
                stats["sum"] += value
                stats["scalars"] += 1
        out.write(json.dumps(row, ensure_ascii=False) + "\n")
        stats["count"] += 1
    out.flush()
    sys.stdout.flush()
