"""Throughput of the ``math`` reward against math-verify called directly, on realistic groups.

Groups of 8 responses per prompt with 2 to 4 distinct final answers, each response 2 to 4 KB of reasoning
with inline LaTeX before the answer (mostly ``\\boxed{}``, some "The final answer is ..."). Both sides use
the same number of worker processes. The last line printed is one JSON object.

    python benchmarks/graders.py [--groups 200] [--processes 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import time

from rlsdk import RolloutConfig, Sample, get_plugin_manager
from rlsdk.rewarding import score_group

FILLER = [
    "Let me think about this step by step. ",
    "We are given that $x^2 + {a}x - {b} = 0$, so by the quadratic formula the roots satisfy $x_1 + x_2 = -{a}$. ",
    "Substituting $y = {a}t + {b}$ into the equation gives $\\frac{{{a}}}{{{b}}} y = {c}$. ",
    "Note that ${a} \\cdot {b} = {ab}$ and ${c}^2 = {c2}$, which we will need later. ",
    "Consider the triangle with sides ${a}$, ${b}$ and ${c}$; by the law of cosines $\\cos\\theta = \\frac{{a^2+b^2-c^2}}{{2ab}}$. ",
    "Hmm, wait. Let me double-check the previous computation: ${a} + {b} = {apb}$, which matches. ",
    "Therefore the sum over $k = 1, \\dots, {a}$ of $k$ equals $\\frac{{{a}({a}+1)}}{{2}}$. ",
]


def _value(rng: random.Random) -> tuple[str, list[str], list[str]]:
    """A label, equivalent spellings of it, and wrong answers of the same kind."""
    kind = rng.random()
    if kind < 0.5:
        n = rng.randint(2, 5000)
        spellings = [str(n), f"{n:,}" if n >= 1000 else f"{n}.0"]
        wrong = [str(n + d) for d in (1, -1, 2, 10, n)]
        return str(n), spellings, wrong
    if kind < 0.65:
        p, q = rng.randint(1, 30), rng.randint(31, 60)
        return (f"\\frac{{{p}}}{{{q}}}", [f"\\frac{{{p}}}{{{q}}}", f"\\dfrac{{{p}}}{{{q}}}", f"{p}/{q}"],
                [f"\\frac{{{p + 1}}}{{{q}}}", f"\\frac{{{q}}}{{{p}}}", f"\\frac{{{p}}}{{{q + 2}}}"])
    if kind < 0.75:
        a, b = rng.randint(2, 9), rng.choice([2, 3, 5, 6, 7])
        return (f"{a}\\sqrt{{{b}}}", [f"{a}\\sqrt{{{b}}}", f"\\sqrt{{{a * a * b}}}", f"{a} \\sqrt{{{b}}}"],
                [f"{a + 1}\\sqrt{{{b}}}", f"\\sqrt{{{a * b}}}", f"{a}\\sqrt{{{b + 1}}}"])
    if kind < 0.85:
        d = round(rng.uniform(0.1, 99.9), 2)
        return str(d), [str(d), f"{d:.2f}"], [str(round(d + 0.5, 2)), str(round(d * 2, 2))]
    a, b = rng.randint(-9, 0), rng.randint(1, 9)
    return (f"[{a}, {b})", [f"[{a},{b})", f"[{a}, {b})", f"\\left[{a}, {b}\\right)"],
            [f"({a}, {b})", f"[{a}, {b}]", f"[{a - 1}, {b})"])


def _reasoning(rng: random.Random) -> str:
    target = rng.randint(2000, 4000)
    parts: list[str] = []
    while sum(map(len, parts)) < target:
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 99)
        parts.append(rng.choice(FILLER).format(a=a, b=b, c=c, ab=a * b, c2=c * c, apb=a + b))
    return "".join(parts)


def make_groups(count: int, seed: int = 0) -> list[tuple[str, list[str]]]:
    """(label, 8 responses) per prompt."""
    rng = random.Random(seed)
    groups = []
    for _ in range(count):
        label, spellings, wrong = _value(rng)
        answers = [rng.choice(spellings)] + rng.sample(wrong, rng.randint(1, min(3, len(wrong))))
        responses = []
        for _ in range(8):
            answer = rng.choice(answers)
            ending = (f"The final answer is ${answer}$." if rng.random() < 0.1
                      else f"Therefore, the final answer is $\\boxed{{{answer}}}$.")
            responses.append(_reasoning(rng) + ending)
        groups.append((label, responses))
    return groups


def _baseline_init() -> None:
    from rlsdk_rm_hub.math_worker import warm_up

    warm_up()  # the same warm-up rlsdk's workers get


def _baseline_grade(item: tuple[str, str]) -> float:
    from math_verify import parse, verify

    label, response = item
    return float(verify(parse(f"${label}$"), parse(response)))


def run_baseline(groups: list[tuple[str, list[str]]], processes: int) -> tuple[list[float], float]:
    items = [(label, r) for label, responses in groups for r in responses]
    with multiprocessing.get_context("spawn").Pool(processes, initializer=_baseline_init) as pool:
        pool.map(_baseline_grade, items[-processes * 8:], chunksize=1)  # warm up on the same kinds
        started = time.perf_counter()
        rewards = pool.map(_baseline_grade, items, chunksize=8)
        return rewards, time.perf_counter() - started


def run_rlsdk(groups: list[tuple[str, list[str]]], processes: int) -> tuple[list[float], float]:
    from rlsdk_rm_hub import math_grader
    from rlsdk_rm_hub.pool import get_pool

    pm = get_plugin_manager()
    args = RolloutConfig(rm_type="math", grader_workers=processes)
    pool = get_pool(processes)
    for future in [pool.submit(math_grader.MATH_VERIFY, ("1", "2"), 10.0) for _ in range(processes * 2)]:
        future.result()  # start and warm the workers
    math_grader.cache.clear()
    samples = [[Sample(group_index=g, index=i, response=r, label=label) for i, r in enumerate(responses)]
               for g, (label, responses) in enumerate(groups)]

    async def score_all() -> None:
        await asyncio.gather(*(score_group(args, pm, group) for group in samples))

    started = time.perf_counter()
    asyncio.run(score_all())
    elapsed = time.perf_counter() - started
    invalid = [s for group in samples for s in group if s.reward is None]
    if invalid:
        raise SystemExit(f"{len(invalid)} invalid rewards, e.g. {invalid[0].metadata}")
    return [s.reward for group in samples for s in group], elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1))
    options = parser.parse_args()
    groups = make_groups(options.groups)
    n = sum(len(r) for _, r in groups)
    ours, ours_s = run_rlsdk(groups, options.processes)
    base, base_s = run_baseline(groups, options.processes)
    agree = sum(a == b for a, b in zip(ours, base)) / n
    base_correct = [i for i, b in enumerate(base) if b == 1.0]
    recall = sum(ours[i] == 1.0 for i in base_correct) / len(base_correct) if base_correct else 1.0
    print(f"{n} samples in {len(groups)} groups, {options.processes} processes: rlsdk math {ours_s:.3f}s "
          f"(mean reward {sum(ours) / n:.3f}), math-verify {base_s:.3f}s (mean reward {sum(base) / n:.3f})")
    result = {
        "samples": n,
        "processes": options.processes,
        "rlsdk_math_samples_per_s": round(n / ours_s, 1),
        "math_verify_samples_per_s": round(n / base_s, 1),
        "agreement": round(agree, 4),
        "recall_vs_math_verify": round(recall, 4),
        "rlsdk_extra_correct": sum(a == 1.0 and b == 0.0 for a, b in zip(ours, base)),
        "ratio": round((n / ours_s) / (n / base_s), 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
