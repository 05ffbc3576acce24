"""Two evals side by side on the same prompts: two runs, or one run's evals after two steps (two
checkpoints). Prompts are matched by their text (a fingerprint of it), within one eval dataset."""

from __future__ import annotations

from typing import Any

from .runs import RunFolder, ViewError
from .samples import SampleFile, preview, prompt_preview

COMPARE_SORTS = ("delta", "-delta", "order")
"""``delta``: where B scores lowest against A first; ``-delta``: highest first; ``order``: A's order."""


def eval_prompts(samples: SampleFile, step: int, dataset: str) -> dict[int, list[int]]:
    """Prompt fingerprint -> line numbers of the eval samples of ``dataset`` after ``step``."""
    index = samples.index
    code = index.codes["dataset"].lookup(dataset)
    column, keys = index.strings["dataset"], index.ints["prompt"]
    prompts: dict[int, list[int]] = {}
    for n in samples.steps.get(step, []):
        if column[n] == code:
            prompts.setdefault(keys[n], []).append(n)
    return prompts


def _side(run: RunFolder, step: int | None, dataset: str | None) -> tuple[int, str]:
    steps = sorted(run.samples["eval"].steps)
    if not steps:
        raise ViewError(f"run {run.name} has no eval samples (eval_samples.jsonl)")
    chosen = steps[-1] if step is None else step
    if chosen not in steps:
        raise ViewError(f"run {run.name} has no eval after step {chosen} (evals after steps: {steps})")
    names = run.samples["eval"].index.codes["dataset"].names
    if dataset is not None and dataset not in names:
        raise ViewError(f"run {run.name} has no eval dataset {dataset!r} (datasets: {', '.join(names)})")
    return chosen, dataset or (names[0] if names else "")


def compare(
    a: RunFolder,
    b: RunFolder,
    step_a: int | None = None,
    step_b: int | None = None,
    dataset: str | None = None,
    order: str = "delta",
    offset: int = 0,
    limit: int = 50,
) -> dict[str, Any]:
    """The prompts both evals scored, each with both sides' mean reward and sample lines, and totals."""
    step_a, dataset = _side(a, step_a, dataset)
    step_b, _ = _side(b, step_b, dataset)
    left, right = a.samples["eval"], b.samples["eval"]
    prompts_a, prompts_b = eval_prompts(left, step_a, dataset), eval_prompts(right, step_b, dataset)
    shared = [key for key in prompts_a if key in prompts_b]
    rows: list[dict[str, Any]] = []
    for key in shared:
        mean_a = _mean(left, prompts_a[key])
        mean_b = _mean(right, prompts_b[key])
        delta = None if mean_a is None or mean_b is None else mean_b - mean_a
        rows.append(
            {
                "key": str(key),
                "a": _part(prompts_a[key], mean_a),
                "b": _part(prompts_b[key], mean_b),
                "delta": delta,
            }
        )
    if order != "order":
        sign = 1 if order == "delta" else -1
        rows.sort(key=lambda r: (r["delta"] is None, sign * (r["delta"] or 0.0)))
    shown = rows[offset : offset + limit]
    for row, first in zip(shown, left.index.read_many([r["a"]["lines"][0] for r in shown]), strict=True):
        row["prompt"] = prompt_preview((first or {}).get("prompt"))
        row["label"] = preview((first or {}).get("label"))
    deltas = [r["delta"] for r in rows if r["delta"] is not None]
    return {
        "a": {"run": a.number, "name": a.name, "step": step_a, "steps": sorted(left.steps)},
        "b": {"run": b.number, "name": b.name, "step": step_b, "steps": sorted(right.steps)},
        "dataset": dataset,
        "datasets": [d for d in left.index.codes["dataset"].names if d in right.index.codes["dataset"].names],
        "only_a": len(prompts_a) - len(shared),
        "only_b": len(prompts_b) - len(shared),
        "total": len(rows),
        "offset": offset,
        "rows": shown,
        "mean_a": _average([r["a"]["mean"] for r in rows]),
        "mean_b": _average([r["b"]["mean"] for r in rows]),
        "better": sum(d > 0 for d in deltas),
        "worse": sum(d < 0 for d in deltas),
        "same": sum(d == 0 for d in deltas),
    }


def _mean(samples: SampleFile, lines: list[int]) -> float | None:
    return _average([samples.index.float_value("reward", n) for n in lines])


def _average(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _part(lines: list[int], mean: float | None) -> dict[str, Any]:
    return {"lines": lines, "mean": mean}
