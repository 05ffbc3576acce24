"""Write rlsdk's default datasets: single-digit arithmetic the small model sometimes solves, so rewards
within a group vary. Each prompt carries one worked example (it makes the model box its answers).

Every distinct problem (a + b and a × b for digits 1-9, a - b with a >= b) appears once, in a seeded
order: the first ``EVAL_PER_OP`` of each operation form the eval file, the rest the training file, so
the eval problems are never trained on.

    python scripts/make_arithmetic.py core/rlsdk/datasets
"""

import json
import random
import sys
from pathlib import Path

INSTRUCTION = "Put your final answer in \\boxed{}."
EXAMPLE = [
    {"role": "user", "content": f"What is 2 + 5? {INSTRUCTION}"},
    {"role": "assistant", "content": "2 + 5 = 7. The answer is \\boxed{7}."},
]
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
EVAL_PER_OP = 16


def row(op: str, a: int, b: int) -> dict:
    question = f"What is {a} {op.replace('*', '×')} {b}? {INSTRUCTION}"
    return {"input": [*EXAMPLE, {"role": "user", "content": question}], "label": str(OPS[op](a, b)),
            "metadata": {"op": op, "a": a, "b": b}}


def split(seed: int = 7) -> tuple[list[dict], list[dict]]:
    rng = random.Random(seed)
    train, held_out = [], []
    for op in OPS:
        problems = [(a, b) for a in range(1, 10) for b in range(1, 10) if op != "-" or a >= b]
        problems.remove((2, 5)) if op == "+" else None  # the worked example
        rng.shuffle(problems)
        held_out += [row(op, a, b) for a, b in problems[:EVAL_PER_OP]]
        train += [row(op, a, b) for a, b in problems[EVAL_PER_OP:]]
    rng.shuffle(train)
    rng.shuffle(held_out)
    return train, held_out


if __name__ == "__main__":
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "core/rlsdk/datasets")
    for name, rows in zip(("arithmetic-train.jsonl", "arithmetic-eval.jsonl"), split(), strict=True):
        (folder / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
