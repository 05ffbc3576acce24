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


def fast_verdict(answer: str, label: str) -> bool | None:
    """True or False when the normalized answer and label decide it exactly; None when math-verify must.

    Equal strings are equal. Two plain numbers are equal when exactly equal, and unequal when they differ
    by more than a rounding tolerance (math-verify accepts ``0.333333`` for ``1/3``, so closer pairs go
    to it).
    """
    a, b = fast_normalize(answer), fast_normalize(label)
    if not a:
        return False
    if a == b:
        return True
    x, y = as_number(a), as_number(b)
    if x is None or y is None:
        return None
    if isinstance(x, str) and isinstance(y, str):
        return x == y
    if isinstance(x, str) or isinstance(y, str):
        return None
    if x == y:
        return True
    if abs(x - y) > Fraction(1, 1000) * max(1, abs(x), abs(y)):
        return False
    return None
