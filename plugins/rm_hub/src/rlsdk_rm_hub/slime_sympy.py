"""The sympy side of slime's MATH grading (``grade_answer_sympy``), for ``slime_math`` and ``deepscaler``.
It evaluates model output with sympy, so the rewards run it in grading workers under a timeout (see
pool.py); slime's reward tests call it in process through ``slime_modules``.

The normalization reads LaTeX with pylatexenc, as slime does, so verdicts match: integers must match
integers exactly (``2^{10}`` is not ``1024``), unreduced fractions must match literally, tuples and
intervals compare their brackets and elements, text answers ignore case.
"""

from __future__ import annotations

import functools
import re

import sympy
from pylatexenc import latex2text
from sympy.parsing import sympy_parser

_UNIT_WORDS = (
    "degree",
    "cm",
    "centimeter",
    "meter",
    "mile",
    "second",
    "minute",
    "hour",
    "day",
    "week",
    "month",
    "year",
    "foot",
    "feet",
    "inch",
    "yard",
)
_UNITS = [re.compile(rf"{unit}(es)?(s)? *(\^[0-9]+)?") for unit in _UNIT_WORDS]
_DEGREES = re.compile(r"\^ *\\circ")
_THIN_SPACE_COMMA = re.compile(r",\\! *")
_TEXT_WRAPPED = re.compile(r"^\\text\{(?P<text>.+?)\}$")
_MINUS_SPACE = re.compile("- *")
_MIXED_NUMBER = re.compile("([0-9]) +([0-9])")
_THOUSANDS_COMMA = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_FRACTION = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
_BRACKETS = "()[]"
_UNSAFE_POWERS = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
_UNICODE_TO_SYMPY = (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*"))


def _without_thousands_commas(expr: str) -> str:
    while True:
        stripped = _THOUSANDS_COMMA.sub(r"\1\3\4", expr)
        if stripped == expr:
            return stripped
        expr = stripped


def _float_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _is_whole(x: float) -> bool:
    try:
        return abs(x - round(x)) <= 1e-7
    except (OverflowError, ValueError):  # inf, nan
        return False


def _reads_as_integer(text: str) -> bool:
    value = _float_or_none(_without_thousands_commas(text))
    return value is not None and _is_whole(value)


def _latex_to_text(expr: str) -> str:
    expr = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    expr = latex2text.LatexNodes2Text().latex_to_text(expr)
    for symbol, name in _UNICODE_TO_SYMPY:
        expr = expr.replace(symbol, name)
    return expr.strip()


def sympy_normalize(expr: str | None) -> str | None:
    """slime's ``_normalize``: unwrap ``\\text{}``; drop ``$``, ``%``, unit words and degrees; ``or``/``and``
    to commas; million/billion/trillion to powers of ten; outer braces off; whole floats to integers;
    LaTeX to plain text; spaces and braces dropped; lower case; integer-valued text to an integer."""
    if expr is None:
        return None
    wrapped = _TEXT_WRAPPED.search(expr)
    if wrapped:
        expr = wrapped.group("text")
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    expr = expr.replace("million", "*10^6").replace("billion", "*10^9").replace("trillion", "*10^12")
    for unit in _UNITS:
        expr = unit.sub("", expr)
    expr = _DEGREES.sub("", expr)
    if expr[:1] == "{" and expr[-1:] == "}":
        expr = expr[1:-1]
    expr = _THIN_SPACE_COMMA.sub("", expr)
    value = _float_or_none(expr)
    if value is not None and _is_whole(value):
        expr = str(round(value))
    if "\\" in expr:
        try:
            expr = _latex_to_text(expr)
        except Exception:  # pylatexenc gives up on malformed LaTeX: keep the text, as slime does
            pass
    expr = _MIXED_NUMBER.sub(r"\1+\2", _MINUS_SPACE.sub("-", expr))
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _reads_as_integer(expr):
        expr = str(int(float(expr.replace(",", ""))))  # truncates, as slime does
    return expr


def _may_evaluate(expr: str) -> bool:
    """Never hand sympy unknown words (more than two distinct letters) or towers of powers."""
    letters = {ch for ch in expr.replace("sqrt", "").replace("frac", "") if ch.isalpha()}
    if len(letters) > 2 or "^{" in expr or "^(" in expr:
        return False
    return not any(pattern.search(expr) for pattern in _UNSAFE_POWERS)


@functools.lru_cache(maxsize=1)
def _sympy_names() -> dict:
    return {"__builtins__": {}, **{k: v for k, v in sympy.__dict__.items() if not k.startswith("_")}}


def _differ_by_zero(gold: str, given: str) -> bool:
    expr = f"({gold})-({given})"
    if not _may_evaluate(expr):
        return False
    try:
        parsed = sympy_parser.parse_expr(
            expr.replace("^", "**"),
            local_dict={},
            global_dict=_sympy_names(),
            transformations=sympy_parser.standard_transformations
            + (sympy_parser.implicit_multiplication_application,),
        )
        return sympy.simplify(parsed) == 0
    except Exception:  # unparseable or incomparable: not equal, as slime decides
        return False


def _elements(expr: str) -> list[str]:
    expr = _without_thousands_commas(expr)
    if not expr:
        return []
    inner = expr[1:-1]
    if (
        len(expr) > 2
        and expr[0] in _BRACKETS
        and expr[-1] in _BRACKETS
        and not any(c in inner for c in _BRACKETS)
    ):
        return [element.strip() for element in inner.split(",")]
    return [expr]


def sympy_equal(given: str, gold: str | None) -> bool:
    """slime's ``grade_answer_sympy``: normalized strings equal, or every element (of a tuple or interval
    with the same brackets) equal: fractions literally, integers only to integers, the rest by sympy."""
    gold_n, given_n = sympy_normalize(gold), sympy_normalize(given)
    if gold_n is None:
        return False
    if gold_n == given_n:
        return True
    if not given_n:
        return False
    golds, givens = _elements(gold_n), _elements(given_n)
    if len(golds) > 1 and (gold_n[0] != given_n[0] or gold_n[-1] != given_n[-1]):
        return False
    if len(golds) != len(givens):
        return False
    for a, b in zip(golds, givens):
        if _FRACTION.search(a) and _FRACTION.search(b):
            equal = a == b
        elif _reads_as_integer(a) != _reads_as_integer(b):
            equal = False
        else:
            equal = _differ_by_zero(a, b)
        if not equal:
            return False
    return True
