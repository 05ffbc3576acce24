"""The shipped arithmetic datasets are what scripts/make_arithmetic.py writes, and every eval file is
disjoint from its training file (the held-out reward measures problems never trained on)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATASETS = ROOT / "core" / "rlsdk" / "datasets"


def generator():
    spec = importlib.util.spec_from_file_location("make_arithmetic", ROOT / "scripts" / "make_arithmetic.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def problems(path: Path) -> list[tuple]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [(r["metadata"]["op"], r["metadata"]["a"], r["metadata"]["b"]) for r in rows]


@pytest.mark.parametrize("prefix, split", [("arithmetic", "split"), ("arithmetic2", "split_two_digit")])
def test_shipped_files_are_the_seeded_generators_output(prefix: str, split: str):
    train, held_out = getattr(generator(), split)()
    for name, rows in ((f"{prefix}-train.jsonl", train), (f"{prefix}-eval.jsonl", held_out)):
        assert (DATASETS / name).read_text() == "".join(
            json.dumps(r, ensure_ascii=False) + "\n" for r in rows
        )


@pytest.mark.parametrize("prefix", ["arithmetic", "arithmetic2"])
def test_eval_problems_are_never_trained_on(prefix: str):
    train, held_out = (
        problems(DATASETS / f"{prefix}-train.jsonl"),
        problems(DATASETS / f"{prefix}-eval.jsonl"),
    )
    assert len(set(train)) == len(train) and len(set(held_out)) == len(held_out)
    assert not set(train) & set(held_out)


def test_two_digit_set_is_two_digit_and_labelled_right():
    rows = [json.loads(line) for line in (DATASETS / "arithmetic2-eval.jsonl").read_text().splitlines()]
    ops = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__}
    assert {r["metadata"]["op"] for r in rows} == set(ops)
    for r in rows:
        op, a, b = r["metadata"]["op"], r["metadata"]["a"], r["metadata"]["b"]
        assert 10 <= a <= 99 and (2 <= b <= 9 if op == "*" else 10 <= b <= 99)
        assert (
            r["label"] == str(ops[op](a, b))
            and f"{a} {op.replace('*', '×')} {b}?" in r["input"][-1]["content"]
        )
