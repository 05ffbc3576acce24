"""Write rlsdk's default dataset: single-digit arithmetic the small model sometimes solves, so rewards
within a group vary. Each prompt carries one worked example (it makes the model box its answers).

    python scripts/make_arithmetic.py > core/rlsdk/datasets/arithmetic.jsonl
"""

import json
import random

INSTRUCTION = "Put your final answer in \\boxed{}."
EXAMPLE = [
    {"role": "user", "content": f"What is 2 + 5? {INSTRUCTION}"},
    {"role": "assistant", "content": "2 + 5 = 7. The answer is \\boxed{7}."},
]
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def rows(count: int = 240, seed: int = 7):
    rng = random.Random(seed)
    for i in range(count):
        op = "+-*"[i % 3]
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        if op == "-" and b > a:
            a, b = b, a
        question = f"What is {a} {op.replace('*', '×')} {b}? {INSTRUCTION}"
        yield {
            "input": [*EXAMPLE, {"role": "user", "content": question}],
            "label": str(OPS[op](a, b)),
            "metadata": {"op": op, "a": a, "b": b},
        }


if __name__ == "__main__":
    for row in rows():
        print(json.dumps(row, ensure_ascii=False))
