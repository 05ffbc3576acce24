"""What runs inside grading workers: the ``math`` grader's comparison of one answer with one label, and
math-verify and sympy comparisons (heavy imports at load are fine here; this module is only imported by
worker processes and the fork server).

:func:`grade_pair` decides in order of cost, each step bounded:
1. the canonical spellings (:mod:`.canonical`) are equal; the empty set only equals the empty set; a
   percentage against a label without the sign is its number of percent or that over 100;
2. a name before the value (``x = 5``, ``f(x) = ...``) is dropped when the other side has none; a set
   ``\\{1, 2\\}`` never equals a pair or interval ``(1, 2)``;
3. both are arithmetic of numbers: exact values (:mod:`.exact`), huge ones by structure, never evaluated
   beyond a bound; a huge number against anything that is not arithmetic is unequal, never sent to sympy,
   and so is an answer too long or too deeply nested for sympy's parser (structural checks first);
4. math-verify decides sets, intervals (an inequality is the interval it defines), tuples, matrices,
   equations and symbolic expressions; a "yes" for two numeric constants stands only if they also agree
   to 40 significant digits (math-verify rounds to 6 places, so ``10^{-7}`` would equal ``0``);
5. with ``i`` as the imaginary unit, sympy decides what math-verify read as a variable.
"""

from __future__ import annotations

import functools
import logging
import re

import math_verify
import sympy
from latex2sympy2_extended import latex2sympy

from . import exact
from .canonical import EMPTY_SET, canonical, percent_variants

logging.getLogger("math_verify").setLevel(logging.ERROR)  # timeouts are ours (see pool.py)

_NAME = re.compile(
    r"(?:^|(?<=,))\s*(?:[a-zA-Z](?:_\{?\w+\}?)?(?:\([a-z]\))?|\([a-z](?:,\s*[a-z])+\))"
    r"\s*(?:=|\\in(?![a-zA-Z]))\s*"
)
_RELATION = re.compile(r"=|\\in(?![a-zA-Z])|\\[lg]e(?:q)?(?![a-zA-Z])|<|>")
_HUGE = re.compile(r"\^\s*\{[^{}]*\^|(?<!\d)\d{6,}\s*\)?\s*!|\^\s*\{?\s*-?\d{6,}")
_IMAGINARY = re.compile(r"(?<![a-zA-Z\\])i(?![a-zA-Z])")
MAX_SYMBOLIC_CHARS = 1500
MAX_SYMBOLIC_NESTING = 10
MAX_SYMBOLIC_POWERS = 30
"""Beyond these sizes an answer is not handed to math-verify and sympy (whose parsers and simplifiers take
minutes on them): what steps 1 to 3 did not show equal is unequal."""
AGREEMENT_DIGITS = 40
"""Two numeric constants math-verify calls equal must agree to this many significant digits."""


def as_math_verify_input(text: str) -> str:
    """An answer or label as math-verify should read it: boxed, unless already boxed or delimited."""
    return text if ("\\boxed" in text or "$" in text) else "\\boxed{" + text + "}"


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> list:
    return math_verify.parse(as_math_verify_input(text), parsing_timeout=None)


def grade_pair(answer: str, label: str) -> bool:
    """Whether a final answer equals a label (see the module docstring for the order of decisions)."""
    a, b = canonical(answer), canonical(label)
    return any(_equal(x, y) for x, y in percent_variants(a, b))


def _equal(a: str, b: str) -> bool:
    if not a or not b:
        return False
    if a == b or a.replace(" ", "") == b.replace(" ", ""):
        return True
    if EMPTY_SET in (a, b):
        return False
    a, b = _drop_names(a, b)
    if _set_against_tuple(a, b) or _set_against_tuple(b, a):
        return False
    verdict = _exact_verdict(a, b)
    if verdict is not None:
        return verdict
    a, b = _without_redundant_brackets(a), _without_redundant_brackets(b)
    if _too_large_for_sympy(a) or _too_large_for_sympy(b):
        return False
    target, gold = math_verify.parse(as_math_verify_input(a), parsing_timeout=None), _parse(b)
    # an inequality is the set it defines, on either side: x > 3 is (3, oo)
    if math_verify.verify(gold, target, allow_set_relation_comp=True, timeout_seconds=None):
        return not _numerically_apart(gold, target)
    return _imaginary_equal(a, b)


def _drop_names(a: str, b: str) -> tuple[str, str]:
    """``x = 5`` against ``5``: the values; both sides keep their names when both have relations."""
    a_rel, b_rel = bool(_RELATION.search(a)), bool(_RELATION.search(b))
    if a_rel and not b_rel:
        return _NAME.sub("", a), b
    if b_rel and not a_rel:
        return a, _NAME.sub("", b)
    return a, b


def _set_against_tuple(a: str, b: str) -> bool:
    """A set ``\\{1, 2\\}`` is neither the pair nor the interval ``(1, 2)`` (math-verify says it is)."""
    return a.startswith("\\{") and a.endswith("\\}") and b[:1] in "([" and b[-1:] in ")]" and "," in b


def _exact_verdict(a: str, b: str) -> bool | None:
    """Decided when both sides are arithmetic of numbers, or one is huge: None when sympy may decide."""
    x, y = exact.value(a), exact.value(b)
    if x is not None and y is not None:
        return bool(exact.equal(x, y))  # undecidable differences of huge forms count as unequal
    if isinstance(x, exact.Huge) or isinstance(y, exact.Huge) or _HUGE.search(a) or _HUGE.search(b):
        return False
    return None


def _without_redundant_brackets(s: str) -> str:
    """``((x))`` as ``(x)``: math-verify's parser takes seconds per level of nested parentheses."""
    try:
        return "".join(exact.drop_redundant_groups(list(s)))
    except exact.NotNumeric:  # unbalanced (escaped braces, half-open intervals): leave it
        return s


def _too_large_for_sympy(s: str) -> bool:
    if len(s) > MAX_SYMBOLIC_CHARS or s.count("^") > MAX_SYMBOLIC_POWERS:
        return True
    depth = deepest = 0
    for ch in s:
        if ch in "({[":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")}]":
            depth -= 1
    return deepest > MAX_SYMBOLIC_NESTING


def _numerically_apart(gold: list, target: list) -> bool:
    """Whether the first parsed values are numeric constants that differ in their first 40 digits."""
    try:
        x, y = gold[0], target[0]
        if not (isinstance(x, sympy.Expr) and isinstance(y, sympy.Expr) and x.is_number and y.is_number):
            return False
        scale = max(abs(sympy.N(x, AGREEMENT_DIGITS + 10)), abs(sympy.N(y, AGREEMENT_DIGITS + 10)), 1)
        difference = abs(sympy.N(x - y, AGREEMENT_DIGITS + 10))
        return bool(difference > scale * sympy.Float(10) ** -AGREEMENT_DIGITS)
    except Exception:  # a comparison sympy cannot evaluate: math-verify's verdict stands
        return False


def _imaginary_equal(a: str, b: str) -> bool:
    """Equality with ``i`` read as the imaginary unit, when either side uses it."""
    if not (_IMAGINARY.search(a) or _IMAGINARY.search(b)):
        return False
    try:
        i = sympy.Symbol("i")
        x, y = (latex2sympy(s).subs(i, sympy.I) for s in (a, b))
        difference = sympy.simplify(x - y)
        return bool(difference == 0)
    except Exception:  # unparseable or incomparable: not shown equal
        return False


def sympy_equal(a: str, b: str) -> bool:
    """Whether two LaTeX expressions differ by zero according to sympy (MATH-style graders)."""
    try:
        left, right = latex2sympy(a), latex2sympy(b)
        return bool(sympy.simplify(left - right) == 0)
    except Exception:  # unparseable or incomparable: not equal, as the MATH graders decide
        return False


def warm_up() -> None:
    """Fill math-verify's and sympy's first-call caches so a worker's first real grading is not slow."""
    for answer, label in (
        ("\\frac{1}{2}", "0.5"),
        ("2\\sqrt{3}", "\\sqrt{12}"),
        ("[1, 2)", "(1, 2]"),
        ("x^2+1", "1+x^2"),
        ("(1,2)", "(1,2)"),
        ("50\\%", "0.5"),
        ("3.14", "\\pi"),
        ("i^2", "-1"),
    ):
        grade_pair(answer, label)
