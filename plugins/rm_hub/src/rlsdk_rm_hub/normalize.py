"""String normalizations of math answers: the MATH benchmark's and Minerva's (DAPO), exactly as slime
applies them, and a conservative one for the ``math`` grader's exact-match fast path, plus exact number
comparison."""

from __future__ import annotations

import re
from fractions import Fraction

# ----- MATH (Hendrycks et al.) normalization, as slime's math_utils applies it (slime_math, deepscaler) --
# Verdicts must equal slime's, quirks included, so each step below is one documented rule of that
# normalization, in its order; the slime-named wrappers in slime_modules/ expose them to slime's tests.

_TEXT_WRAPPED = re.compile(r"\\text\{(?P<text>.+?)\}")
_CANONICAL_SLASH = re.compile(r"(0|-?[1-9][0-9]*)/(0|-?[1-9][0-9]*)")


def mathd_normalize(answer: str | None) -> str | None:
    """slime's ``mathd_normalize_answer``: strip, unwrap a ``\\text{...}`` that encloses the whole
    answer, then :func:`math_normalize`; an answer that normalization chokes on is kept as it is."""
    if answer is None:
        return None
    answer = answer.strip()
    wrapped = _TEXT_WRAPPED.fullmatch(answer)
    if wrapped:
        answer = wrapped.group("text").strip()
    try:
        return math_normalize(answer)
    except (IndexError, ValueError):
        return answer


def _sqrt_braced(s: str) -> str:
    head, *tails = s.split("\\sqrt")
    return head + "".join("\\sqrt" + (t if t[0] == "{" else "{" + t[0] + "}" + t[1:]) for t in tails)


def _frac_braced(s: str) -> str:
    head, *tails = s.split("\\frac")
    out = [head]
    for tail in tails:
        if tail[0] == "{":
            out.append("\\frac" + tail)
        elif len(tail) < 2:
            return s  # "\frac" then one character: the whole string is left as it was
        elif tail[1] == "{":
            out.append("\\frac{" + tail[0] + "}" + tail[1:])
        else:
            out.append("\\frac{" + tail[0] + "}{" + tail[1] + "}" + tail[2:])
    return "".join(out)


def math_normalize(text: str) -> str:
    """slime's ``_strip_string`` (the MATH benchmark's): drop line breaks, ``\\!``, ``\\left``/``\\right``,
    degrees, ``\\$``, ``\\%`` and a unit after ``\\text{ ``; ``dfrac``/``tfrac`` to ``frac``; a leading
    ``.`` gets its ``0``; a prefix of at most two characters before a single ``=`` goes; ``\\sqrt3`` and
    ``\\frac12`` get braces; spaces go; ``0.5`` and canonical integer ``a/b`` become ``\\frac``.
    Raises IndexError or ValueError on a dangling ``\\sqrt``/``\\frac`` or several unit markers, as slime."""
    s = text.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac").replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in s:
        before, *after = s.split("\\text{ ")
        if len(after) != 1:
            raise ValueError(f"more than one unit marker in {text!r}")
        s = before
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    if "\\sqrt" in s:
        s = _sqrt_braced(s)
    s = _frac_braced(s.replace(" ", ""))
    if s == "0.5":
        return "\\frac{1}{2}"
    slash = _CANONICAL_SLASH.fullmatch(s)
    return f"\\frac{{{slash.group(1)}}}{{{slash.group(2)}}}" if slash else s


def mathd_equal(answer: str | None, label: str | None) -> bool:
    """slime's ``grade_answer_mathd``: the MATH-normalized strings are equal."""
    return mathd_normalize(label) == mathd_normalize(answer)


# ----- Minerva normalization, as slime's math_dapo_utils applies it (dapo) ------------------------------

_MINERVA_SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_MINERVA_REMOVED = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
    "<|im_end|>",
    "<|endoftext|>",
)
_MINERVA_REWRITES = (
    (re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), r"$\3$"),  # keep only the first $...$ of the answer
    (re.compile(r"\\text\{(.*?)\}"), r"\1"),
    (re.compile(r"\\textbf\{(.*?)\}"), r"\1"),
    (re.compile(r"\\overline\{(.*?)\}"), r"\1"),
    (re.compile(r"\\boxed\{(.*)\}"), r"\1"),
    (re.compile(r"frac([^{])(.)"), r"frac{\1}{\2}"),
    (re.compile(r"sqrt([^{])"), r"sqrt{\1}"),
)


def minerva_normalize(text: object) -> str:
    """slime's ``normalize_final_answer`` (Minerva's, DAPO's grader): the right side of the last ``=``;
    articles, spaces, ``\\$``, unit words and end-of-turn tokens removed; the first ``$...$`` kept;
    ``\\text``/``\\textbf``/``\\overline``/``\\boxed`` unwrapped; short ``frac``/``sqrt`` braced; dollar
    signs dropped; commas of an all-digit answer dropped."""
    s = str(text).split("=")[-1]
    for old, new in _MINERVA_SUBSTITUTIONS:
        s = s.replace(old, new)
    for removed in _MINERVA_REMOVED:
        s = s.replace(removed, "")
    for pattern, replacement in _MINERVA_REWRITES:
        s = pattern.sub(replacement, s)
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")


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
    if abs(x - y) > Fraction(1, 1000) * max(Fraction(1), abs(x), abs(y)):
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
