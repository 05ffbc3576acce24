"""Write rlsdk's shipped arithmetic datasets. Each prompt carries one worked example (it makes the model
box its answers); the example's problem is in neither file.

``arithmetic-{train,eval}.jsonl`` (the default demo): single-digit arithmetic the small model sometimes
solves, so rewards within a group vary. Every distinct problem (a + b and a × b for digits 1-9, a - b with
a >= b) appears once, in a seeded order: the first ``EVAL_PER_OP`` of each operation form the eval file,
the rest the training file.

``arithmetic2-{train,eval}.jsonl`` (the GPU learning run, harder): two-digit addition and subtraction
(a >= b) and a two-digit number times one digit (2-9), ``TWO_DIGIT_EVAL_PER_OP`` and
``TWO_DIGIT_TRAIN_PER_OP`` distinct problems of each drawn without replacement with a fixed seed.

Either way the eval problems are never trained on.

    python scripts/make_arithmetic.py core/rlsdk/datasets
"""

import json
import random
import sys
from pathlib import Path

INSTRUCTION = "Put your final answer in \\boxed{}."
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
EVAL_PER_OP = 16
TWO_DIGIT_EVAL_PER_OP = 64
TWO_DIGIT_TRAIN_PER_OP = 500


def example(a: int, b: int) -> list[dict]:
    return [
        {"role": "user", "content": f"What is {a} + {b}? {INSTRUCTION}"},
        {"role": "assistant", "content": f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}."},
    ]


def row(op: str, a: int, b: int, shown: list[dict]) -> dict:
    question = f"What is {a} {op.replace('*', '×')} {b}? {INSTRUCTION}"
    return {
        "input": [*shown, {"role": "user", "content": question}],
        "label": str(OPS[op](a, b)),
        "metadata": {"op": op, "a": a, "b": b},
    }


def split(seed: int = 7) -> tuple[list[dict], list[dict]]:
    """Single digits: every problem once, ``EVAL_PER_OP`` of each operation held out."""
    rng = random.Random(seed)
    shown = example(2, 5)
    train, held_out = [], []
    for op in OPS:
        problems = [(a, b) for a in range(1, 10) for b in range(1, 10) if op != "-" or a >= b]
        problems.remove((2, 5)) if op == "+" else None  # the worked example
        rng.shuffle(problems)
        held_out += [row(op, a, b, shown) for a, b in problems[:EVAL_PER_OP]]
        train += [row(op, a, b, shown) for a, b in problems[EVAL_PER_OP:]]
    rng.shuffle(train)
    rng.shuffle(held_out)
    return train, held_out


def split_two_digit(seed: int = 11) -> tuple[list[dict], list[dict]]:
    """Two-digit a + b and a - b (a >= b), two-digit a × one digit b (2-9); disjoint seeded samples."""
    rng = random.Random(seed)
    shown = example(23, 45)
    two = range(10, 100)
    problems = {
        "+": [(a, b) for a in two for b in two if (a, b) != (23, 45)],
        "-": [(a, b) for a in two for b in two if a >= b],
        "*": [(a, b) for a in two for b in range(2, 10)],
    }
    train, held_out = [], []
    for op, pairs in problems.items():
        drawn = rng.sample(pairs, TWO_DIGIT_EVAL_PER_OP + TWO_DIGIT_TRAIN_PER_OP)
        held_out += [row(op, a, b, shown) for a, b in drawn[:TWO_DIGIT_EVAL_PER_OP]]
        train += [row(op, a, b, shown) for a, b in drawn[TWO_DIGIT_EVAL_PER_OP:]]
    rng.shuffle(train)
    rng.shuffle(held_out)
    return train, held_out


def write(folder: Path, name: str, rows: list[dict]) -> None:
    (folder / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


if __name__ == "__main__":
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "core/rlsdk/datasets")
    for prefix, (train, held_out) in (("arithmetic", split()), ("arithmetic2", split_two_digit())):
        write(folder, f"{prefix}-train.jsonl", train)
        write(folder, f"{prefix}-eval.jsonl", held_out)
