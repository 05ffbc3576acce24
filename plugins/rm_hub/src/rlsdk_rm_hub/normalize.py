"""String normalizations of math answers: the MATH benchmark's, Minerva's (DAPO), and a conservative one
for the ``math`` grader's exact-match fast path, plus exact number comparison."""

from __future__ import annotations

import re
from fractions import Fraction

# ----- MATH (Hendrycks et al.) normalization, used by slime_math and deepscaler ----------------------

_UNIT_TEXT = re.compile(r"\\text\{\s*[^{}]*\}\s*$")
_SQRT_SHORT = re.compile(r"\\sqrt\s*([^\s{\\])")
_FRAC_SHORT = re.compile(r"\\frac\s*([^\s{\\])\s*([^\s{\\])")
_FRAC_HALF_SHORT = re.compile(r"\\frac\s*\{([^{}]*)\}\s*([^\s{\\])")
_FRAC_FIRST_SHORT = re.compile(r"\\frac\s*([^\s{\\])\s*\{")
_SLASH_INT = re.compile(r"^(-?\d+)/(\d+)$")


def math_normalize(text: str) -> str:
    """Normalize an answer the way the MATH benchmark's equivalence check does: drop spacing, ``\\left``,
    degrees, dollars, units, percent; ``dfrac``/``tfrac`` to ``frac``; braces on short ``\\frac``/``\\sqrt``;
    ``0.5`` and ``a/b`` to ``\\frac``; a short ``x =`` prefix removed."""
    s = str(text).strip().replace("\n", "").replace("\\!", "")
    s = s.replace("\\\\", "\\").replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "").replace("$", "")
    s = _UNIT_TEXT.sub("", s).strip()
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    parts = s.split("=")
    if len(parts) == 2 and len(parts[0].strip()) <= 2:
        s = parts[1]
    s = _SQRT_SHORT.sub(r"\\sqrt{\1}", s)
    s = s.replace(" ", "")
    s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_HALF_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_FIRST_SHORT.sub(r"\\frac{\1}{", s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    match = _SLASH_INT.match(s)
    if match:
        s = f"\\frac{{{match.group(1)}}}{{{match.group(2)}}}"
    return s


# ----- Minerva normalization, used by dapo ---------------------------------------------------------

_MINERVA_REMOVE = ("an ", "a ", ".$", "\\$", "\\ ", " ", "mbox", ",\\text{and}", "\\text{and}", "\\text{m}")
_MINERVA_UNITS = (
    "square", "ways", "integers", "dollars", "mph", "inches", "ft", "hours", "km", "units", "\\ldots",
    "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters",
    "meals", "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}",
    "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "^\\circ", "^{\\circ}",
)
_WRAPPERS = re.compile(r"\\(?:text|textbf|overline|boxed|mathrm)\{(.*?)\}")
_INLINE_MATH = re.compile(r"\$(.+?)\$")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")


def minerva_normalize(text: str) -> str:
    """Normalize a final answer as the Minerva paper does (DAPO's grader): keep the right side of the last
    ``=``, drop articles, spacing, unit words and text wrappers, fix short ``\\frac``/``\\sqrt``, drop
    thousands separators."""
    s = str(text).split("=")[-1]
    for old in _MINERVA_REMOVE:
        s = s.replace(old, "")
    for unit in _MINERVA_UNITS:
        s = s.replace(unit, "")
    inline = _INLINE_MATH.search(s)
    if inline:
        s = inline.group(1)
    s = _WRAPPERS.sub(r"\1", s)
    s = _WRAPPERS.sub(r"\1", s)
    s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_FIRST_SHORT.sub(r"\\frac{\1}{", s)
    s = _SQRT_SHORT.sub(r"\\sqrt{\1}", s)
    s = s.replace("$", "").strip()
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    return s


# ----- the math grader's fast path -----------------------------------------------------------------

_SPACING = re.compile(r"\\[,;:! ]|\\(?:left|right|displaystyle)\b|~|\s+")
_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)$")
_FRACTION = re.compile(r"^([+-]?)(?:\\frac\{(\d+)\}\{(\d+)\}|(\d+)/(\d+))$")
MAX_DIGITS = 1000
"""Longer numbers are compared as strings, never converted (Python caps int-from-string at 4300 digits)."""


def fast_normalize(text: str) -> str:
    """A normalization that never makes two different answers equal: spacing commands, ``\\left``,
    ``\\right``, dollar signs, a trailing period, ``dfrac``/``tfrac`` and thousands separators."""
    s = str(text).strip().strip("$").strip()
    s = _SPACING.sub("", s).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("{,}", ",")
    s = s.rstrip(".")
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    return s


def as_number(s: str) -> Fraction | str | None:
    """An exact value for a plain integer, decimal or fraction; a long integer stays a canonical string;
    None when ``s`` is not a plain number."""
    if _NUMBER.match(s):
        if len(s) > MAX_DIGITS:
            if "." in s:
                return None
            sign = "-" if s.startswith("-") else ""
            digits = s.lstrip("+-").lstrip("0") or "0"
            return sign + digits if digits != "0" else "0"
        return Fraction(s)
    match = _FRACTION.match(s)
    if match and len(s) <= MAX_DIGITS:
        sign, num, den = match.group(1), match.group(2) or match.group(4), match.group(3) or match.group(5)
        if int(den) == 0:
            return None
        value = Fraction(int(num), int(den))
        return -value if sign == "-" else value
    return None


_RADICAL = re.compile(r"^([+-]?)(\d*)\\sqrt\{(\d+)\}$")
_BRACKETED = re.compile(r"^([(\[])([^()\[\]{}]*)([)\]])$")


def _radical(s: str) -> float | None:
    match = _RADICAL.match(s)
    if not match or len(s) > 50:
        return None
    value = int(match.group(2) or 1) * float(match.group(3)) ** 0.5
    return -value if match.group(1) == "-" else value


def _decided_unequal(a: str, b: str) -> bool:
    """Whether two simple closed forms (numbers, fractions, ``k\\sqrt{n}``) are numerically far apart."""
    values = []
    for s in (a, b):
        number = as_number(s)
        value = float(number) if number is not None and not isinstance(number, str) else _radical(s)
        if value is None:
            return False
        values.append(value)
    return abs(values[0] - values[1]) > 1e-6 * max(1.0, abs(values[0]), abs(values[1]))


def _bracketed_verdict(a: str, b: str) -> bool | None:
    """Intervals and tuples of plain numbers: equal brackets and elements, or decidedly different."""
    x, y = _BRACKETED.match(a), _BRACKETED.match(b)
    if not x or not y:
        return None
    xs, ys = x.group(2).split(","), y.group(2).split(",")
    if len(xs) != len(ys) or len(xs) < 2:
        return None
    verdicts = [_number_verdict(p, q) for p, q in zip(xs, ys)]
    if None in verdicts:
        return None
    return (x.group(1), x.group(3)) == (y.group(1), y.group(3)) and all(verdicts)


def _number_verdict(a: str, b: str) -> bool | None:
    if a == b:
        return True
    x, y = as_number(a), as_number(b)
    if x is None or y is None:
        return False if _decided_unequal(a, b) else None
    if isinstance(x, str) and isinstance(y, str):
        return x == y
    if isinstance(x, str) or isinstance(y, str):
        return None
    if x == y:
        return True
    if abs(x - y) > Fraction(1, 1000) * max(1, abs(x), abs(y)):
        return False
    return None


def fast_verdict(answer: str, label: str) -> bool | None:
    """True or False when the normalized answer and label decide it exactly; None when math-verify must.

    Equal strings are equal. Two plain numbers are equal when exactly equal, and unequal when they differ
    by more than a rounding tolerance (math-verify accepts ``0.333333`` for ``1/3``, so closer pairs go
    to it); simple radicals ``k\\sqrt{n}`` far from the other value are unequal; intervals and tuples of
    plain numbers compare brackets and elements.
    """
    a, b = fast_normalize(answer), fast_normalize(label)
    if not a:
        return False
    verdict = _number_verdict(a, b)
    return verdict if verdict is not None else _bracketed_verdict(a, b)
