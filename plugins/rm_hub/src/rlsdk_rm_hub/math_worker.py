"""What runs inside grading workers: math-verify and sympy comparisons (heavy imports at load are fine
here; this module is only imported by worker processes and the fork server)."""

from __future__ import annotations

import functools
import logging

import math_verify
import sympy
from latex2sympy2_extended import latex2sympy

logging.getLogger("math_verify").setLevel(logging.ERROR)  # timeouts are ours (see pool.py)


def as_math_verify_input(text: str) -> str:
    """An answer or label as math-verify should read it: boxed, unless already boxed or delimited."""
    return text if ("\\boxed" in text or "$" in text) else "\\boxed{" + text + "}"


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> list:
    return math_verify.parse(as_math_verify_input(text), parsing_timeout=None)


def math_verify_equal(answer: str, label: str) -> bool:
    """math-verify's verdict on an extracted answer against a label (labels are parsed once per worker)."""
    gold = _parse(label)
    target = math_verify.parse(as_math_verify_input(answer), parsing_timeout=None)
    return bool(math_verify.verify(gold, target, timeout_seconds=None))


def sympy_equal(a: str, b: str) -> bool:
    """Whether two LaTeX expressions differ by zero according to sympy (MATH-style graders)."""
    try:
        left, right = latex2sympy(a), latex2sympy(b)
        return bool(sympy.simplify(left - right) == 0)
    except Exception:  # unparseable or incomparable: not equal, as the MATH graders decide
        return False


def warm_up() -> None:
    """Fill math-verify's and sympy's first-call caches so a worker's first real grading is not slow."""
    for answer, label in (("\\frac{1}{2}", "0.5"), ("2\\sqrt{3}", "\\sqrt{12}"), ("[1, 2)", "(1, 2]"),
                          ("x^2+1", "1+x^2"), ("(1,2)", "(1,2)"), ("50\\%", "0.5"), ("3.14", "\\pi")):
        math_verify_equal(answer, label)
