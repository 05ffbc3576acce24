"""Math graders side by side: accuracy against hand-decided truth, and throughput on realistic groups.

Three graders: rlsdk's ``math`` reward, math-verify alone (``verify(parse("$label$"), parse(response))``,
the field's default) and ``slime_math`` (slime's grader logic in rlsdk). Accuracy is measured on
``benchmarks/graders/cases.jsonl``: hand-decided cases, each with its truth and the reason for it (batch
``held_out`` was written after the grader passed batch ``first``, and first run as a held-out check). Every
grader runs each case in a worker process under the same timeout (math-verify in rlsdk's grading pool, so
a case that hangs in C is killed); a case that times out or fails counts as wrong. Throughput is measured
on groups of 8 responses per prompt with 2 to 4 distinct final answers (integers, decimals, fractions,
radicals, intervals, and one group in ten a polynomial that only sympy decides), each response 2 to 4 KB
of reasoning with inline LaTeX before the answer (mostly ``\\boxed{}``, some "The final answer is ...").
Both sides use the same number of worker processes. The last line printed is one JSON object.

    python benchmarks/graders.py [--groups 200] [--processes 2] [--timeout 10] [--skip-throughput]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing
import os
import pathlib
import random
import sys
import time

from rlsdk import RolloutConfig, Sample, get_plugin_manager
from rlsdk.rollout.rewarding import score_group

CASES = pathlib.Path(__file__).with_name("graders") / "cases.jsonl"
GRADERS = ("math", "math_verify", "slime_math")

FILLER = [
    "Let me think about this step by step. ",
    "We are given that $x^2 + {a}x - {b} = 0$, so by the quadratic formula the roots satisfy $x_1 + x_2 = -{a}$. ",
    "Substituting $y = {a}t + {b}$ into the equation gives $\\frac{{{a}}}{{{b}}} y = {c}$. ",
    "Note that ${a} \\cdot {b} = {ab}$ and ${c}^2 = {c2}$, which we will need later. ",
    "Consider the triangle with sides ${a}$, ${b}$ and ${c}$; by the law of cosines $\\cos\\theta = \\frac{{a^2+b^2-c^2}}{{2ab}}$. ",
    "Hmm, wait. Let me double-check the previous computation: ${a} + {b} = {apb}$, which matches. ",
    "Therefore the sum over $k = 1, \\dots, {a}$ of $k$ equals $\\frac{{{a}({a}+1)}}{{2}}$. ",
]


def load_cases(path: pathlib.Path = CASES) -> list[dict]:
    """The hand-decided cases: id, category, response, label, correct (the truth), reason."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ----- math-verify alone, as a task for rlsdk's grading workers ---------------------------------------

def math_verify_response(response: str, label: str) -> bool:
    """math-verify on a whole response against a label, its timeouts off (the worker's timer bounds it)."""
    from math_verify import parse, verify

    gold = parse(f"${label}$", parsing_timeout=None)
    return bool(verify(gold, parse(response, parsing_timeout=None), timeout_seconds=None))


MATH_VERIFY_TASK = "graders:math_verify_response"


def _grade_cases(grader: str, cases: list[dict], timeout: float, processes: int) -> list[float | None]:
    """Each case's reward by ``grader`` (None when it timed out or failed)."""
    if grader == "math_verify":
        from rlsdk_rm_hub.pool import GraderPool

        pool = GraderPool(processes)
        try:
            futures = [pool.submit(MATH_VERIFY_TASK, (c["response"], c["label"]), timeout) for c in cases]
            return [_result(f) for f in futures]
        finally:
            pool.shutdown()
    pm = get_plugin_manager()
    args = RolloutConfig(rm_type=grader, grader_workers=processes, grader_timeout=timeout,
                         reward_timeout=timeout * 4)
    samples = [Sample(group_index=i, index=0, response=c["response"], label=c["label"],
                      status=Sample.Status.COMPLETED) for i, c in enumerate(cases)]

    async def score_all() -> None:
        in_flight = asyncio.Semaphore(2 * processes)  # the reward timeout must not count time in a queue

        async def score(sample: Sample) -> None:
            async with in_flight:
                await score_group(args, pm, [sample])

        await asyncio.gather(*(score(s) for s in samples))

    asyncio.run(score_all())
    return [None if s.reward is None else float(s.reward) for s in samples]


def _result(future) -> float | None:
    from rlsdk_rm_hub.pool import WorkerError

    try:
        return float(future.result())
    except WorkerError:  # timed out or failed: undecided
        return None


def accuracy(cases: list[dict], rewards: list[float | None]) -> dict:
    """Agreement with truth, false positives, recall, undecided cases, and the misses by id."""
    wrong = [c["id"] for c, r in zip(cases, rewards) if r is None or (r == 1.0) != c["correct"]]
    false_pos = [c["id"] for c, r in zip(cases, rewards) if r == 1.0 and not c["correct"]]
    positives = [r for c, r in zip(cases, rewards) if c["correct"]]
    per_category: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    per_batch: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for c, r in zip(cases, rewards):
        for group in (per_category[c["category"]], per_batch[c.get("batch", "first")]):
            group[0] += r is not None and (r == 1.0) == c["correct"]
            group[1] += 1
    return {
        "agreement": round(1 - len(wrong) / len(cases), 4),
        "false_positives": len(false_pos),
        "recall": round(sum(r == 1.0 for r in positives) / len(positives), 4),
        "undecided": sum(r is None for r in rewards),
        "per_batch": {k: f"{v[0]}/{v[1]}" for k, v in sorted(per_batch.items())},
        "per_category": {k: f"{v[0]}/{v[1]}" for k, v in sorted(per_category.items())},
        "wrong": wrong,
    }


# ----- throughput on realistic groups -------------------------------------------------------------

def _value(rng: random.Random) -> tuple[str, list[str], list[str]]:
    """A label, equivalent spellings of it, and wrong answers of the same kind."""
    kind = rng.random()
    if kind < 0.1:  # symbolic: only sympy (in a worker) can tell
        a = rng.randint(2, 9)
        return (f"(x+{a})^2", [f"x^2+{2 * a}x+{a * a}", f"(x+{a})^2", f"({a}+x)^2"],
                [f"x^2+{a * a}", f"(x-{a})^2", f"x^2+{a}x+{a * a}"])
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
    for future in [pool.submit(math_grader.GRADE, ("1", "2"), 10.0) for _ in range(processes * 2)]:
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


def throughput(groups_count: int, processes: int) -> dict:
    groups = make_groups(groups_count)
    n = sum(len(r) for _, r in groups)
    ours, ours_s = run_rlsdk(groups, processes)
    base, base_s = run_baseline(groups, processes)
    return {
        "samples": n,
        "math_samples_per_s": round(n / ours_s, 1),
        "math_verify_samples_per_s": round(n / base_s, 1),
        "ratio": round(base_s / ours_s, 2),
        "agreement_with_math_verify": round(sum(a == b for a, b in zip(ours, base)) / n, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per case, every grader")
    parser.add_argument("--graders", default=",".join(GRADERS))
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--show-wrong", action="store_true", help="print each miss with its reason")
    options = parser.parse_args()
    # math-verify's task is this module, imported by name in the grading workers
    os.environ["PYTHONPATH"] = os.pathsep.join([str(pathlib.Path(__file__).parent),
                                                os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cases = load_cases()
    by_id = {c["id"]: c for c in cases}
    result: dict = {"cases": len(cases), "processes": options.processes, "timeout_s": options.timeout}
    for grader in filter(None, options.graders.split(",")):
        started = time.perf_counter()
        rewards = _grade_cases(grader, cases, options.timeout, options.processes)
        summary = accuracy(cases, rewards)
        summary["seconds"] = round(time.perf_counter() - started, 1)
        print(f"{grader}: agreement {summary['agreement']:.2%}, false positives {summary['false_positives']}, "
              f"recall {summary['recall']:.2%}, undecided {summary['undecided']}, {summary['seconds']}s",
              file=sys.stderr)
        if options.show_wrong:
            for case_id in summary["wrong"]:
                c = by_id[case_id]
                print(f"  {case_id}: truth {c['correct']} ({c['reason']}); label {c['label'][:60]!r}; "
                      f"response ...{c['response'][-80:]!r}", file=sys.stderr)
        result[grader] = summary
    if not options.skip_throughput:
        result["throughput"] = throughput(options.groups, options.processes)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
