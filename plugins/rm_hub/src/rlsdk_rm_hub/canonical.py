"""The canonical spelling of a final answer: what the ``math`` grader compares, before any mathematics.

Only rewrites that never change a value: LaTeX spacing, sizing and font commands, unicode symbols, units and
currency around a number, thousands separators, the empty set's notations, repeating decimals as exact
fractions, E notation, a multiple-choice letter before the value. Percent signs are kept (the grader
decides what they mean against the label). Linear-time regular expressions, so it runs in process.
"""

from __future__ import annotations

import re
from fractions import Fraction

EMPTY_SET = "\\emptyset"

_UNICODE = {
    "−": "-",
    "–": "-",
    "×": "\\times ",
    "·": "\\cdot ",
    "÷": "\\div ",
    "√": "\\sqrt",
    "π": "\\pi ",
    "∞": "\\infty ",
    "≤": "\\le ",
    "≥": "\\ge ",
    "≠": "\\ne ",
    "∅": EMPTY_SET + " ",
    "∪": "\\cup ",
    "∩": "\\cap ",
    "°": "^\\circ",
    "€": "",
    "£": "",
    "¥": "",
    "\u00a0": " ",
}
_UNICODE_RE = re.compile("|".join(map(re.escape, _UNICODE)))
_ROW_BREAK = "\x01"
_DELIMITERS = re.compile(r"\\[()\[\]]")
_SPACING = re.compile(
    r"\\[,;:! ]|\\q?quad\b|\\(?:displaystyle|textstyle|left\.?|right\.?|big|Big|bigg|Bigg)"
    r"(?![a-zA-Z])|~"
)
_FRAC_SYNONYM = re.compile(r"\\[dt]frac(?![a-zA-Z])")
_BINOM_SYNONYM = re.compile(r"\\[dt]binom(?![a-zA-Z])")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\degree(?![a-zA-Z])")
_CURRENCY = re.compile(r"\\\$|\\text\{\s*\\\$\s*\}|\$|\bUSD\b")
_EMPTY = re.compile(r"\\(?:emptyset|varnothing|O)(?![a-zA-Z])|\\\{\s*\\\}")
_EMPTY_WORDS = re.compile(r"(?i)^(?:the\s+)?empty\s+set$")
_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|textit|mathrm|mathbf|mathit|mbox|boldsymbol|boxed|fbox)\s*\{")
_WORDS = re.compile(r"^[A-Za-z][A-Za-z .'/-]*(?:\^\{?\d\}?)?$")
_UNIT_MARK = "\x00"
_DROPPED_UNIT = re.compile(r"\x00(?:\s*\^\s*(?:\d|\{\d\}))?")
_JOINER = re.compile(r"(?i)^\s*(?:and|or|,)\s*$")
_CHOICE = re.compile(r"^\(?[A-E]\)\s+(?=\S)")
_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:(?:\{,\}|,|\\,|\s)\d{3})+(?![\d])")
_PLAIN_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_REPEATING = re.compile(
    r"(?<![\d.])(-?)(\d*)\.(\d*)(?:\\overline\{(\d+)\}|\\overline(\d)|\\dot\{(\d)\}|\\dot(\d))"
)
_E_NOTATION = re.compile(r"(?<![\w.\\])(\d+(?:\.\d+)?)[eE]([+-]?\d+)(?![\w.])")
_TRAILING = re.compile(r"[\s.;]+$")
_UNIT_WORD = re.compile(
    r"\s*(?:(?:square|sq\.?|cubic)\s+)?\b(?:cm|mm|km|m|kg|g|mg|s|sec|seconds?|min|minutes?|h|hrs?|hours?|days?|"
    r"in|inches|inch|ft|feet|foot|yd|yards?|miles?|mph|meters?|metres?|units?|dollars?|cents?|euros?|pounds?|"
    r"degrees?|liters?|litres?|L|ml|mL|km/h|m/s|cm/s)(?:\^\{?\d\}?)?\s*$"
)


def canonical(text: str) -> str:
    """The answer as the grader compares it (idempotent)."""
    s = _UNICODE_RE.sub(lambda m: _UNICODE[m.group(0)], str(text))
    s = s.replace("\\\\", _ROW_BREAK)  # a matrix's row separator is no spacing command
    s = _DELIMITERS.sub("", s)
    s = _SPACING.sub(" ", s)
    s = _FRAC_SYNONYM.sub("\\\\frac", s)
    s = _BINOM_SYNONYM.sub("\\\\binom", s)
    s = _DEGREES.sub("", s)
    s = _CURRENCY.sub("", s)
    s = s.replace("\\mathrm{e}", "e").replace("\\textrm{e}", "e")
    s = _strip_unit(_unwrap(s))
    s = _CHOICE.sub("", s.strip())
    s = _EMPTY.sub(lambda m: EMPTY_SET + " ", s)
    s = _E_NOTATION.sub(lambda m: f"{m.group(1)}\\times 10^{{{int(m.group(2))}}}", s)
    s = _REPEATING.sub(_repeating_fraction, s)
    s = _THOUSANDS.sub(lambda m: re.sub(r"\{,\}|,|\\,|\s", "", m.group(0)), s) if _has_groups(s) else s
    s = _TRAILING.sub("", s.strip())
    s = re.sub(r"\s+", " ", s).strip()
    return s.replace(_ROW_BREAK, "\\\\")


def _has_groups(s: str) -> bool:
    """Whether digit groups in ``s`` are thousands separators: the whole answer is one grouped number
    (``1,000``), or groups use ``{,}`` or thin spaces, which never separate list items."""
    stripped = s.strip()
    return (
        bool(_PLAIN_THOUSANDS.match(stripped))
        or "{,}" in s
        or bool(re.search(r"\d\\,\d", s))
        or bool(re.fullmatch(r"[+-]?\d{1,3}(?: \d{3})+", stripped))
    )


def _unwrap(s: str) -> str:
    """Replace ``\\text{...}``-style wrappers, innermost first: words after a number are units (dropped),
    'and'/'or' join list items, 'empty set' is the empty set, anything else keeps its content."""
    for _ in range(50):
        s = _DROPPED_UNIT.sub(" ", s)
        last = None
        for last in _WRAPPER.finditer(s):
            pass
        if last is None:
            return s
        end = _closing_brace(s, last.end())
        if end is None:
            return s
        s = (
            s[: last.start()]
            + _wrapped(s[last.end() : end].strip(), s[: last.start()].rstrip())
            + s[end + 1 :]
        )
    return s


def _closing_brace(s: str, start: int) -> int | None:
    """The index of the brace that closes the group opened just before ``start``."""
    depth = 1
    for i in range(start, len(s)):
        depth += (s[i] == "{") - (s[i] == "}")
        if not depth:
            return i
    return None


def _wrapped(content: str, before: str) -> str:
    if _JOINER.match(content):
        return ", "
    if _EMPTY_WORDS.match(content):
        return EMPTY_SET
    if content == "e":
        return "e"
    if (
        _WORDS.match(content)
        and before
        and (before[-1].isdigit() or before[-1] in "}" or before.endswith("pi"))
    ):
        return _UNIT_MARK  # a unit after a number: 5\\text{ cm}, 16\\pi\\text{ cm}^3
    if re.match(r"^[+-]?\d", content):
        number = re.match(r"^[+-]?[\d.,]+(?:\s*%)?", content)
        rest = content[number.end() :].strip() if number else content
        if number and (not rest or _WORDS.match(rest)):
            return number.group(0)  # \\text{12 apples}
    return " " + content + " "


def _repeating_fraction(match: re.Match) -> str:
    sign, whole, fixed = match.group(1), match.group(2) or "0", match.group(3)
    repeat = next(g for g in match.groups()[3:] if g)
    value = Fraction(int(whole)) + (Fraction(int(fixed), 10 ** len(fixed)) if fixed else 0)
    value += Fraction(int(repeat), (10 ** len(repeat) - 1) * 10 ** len(fixed))
    text = (
        f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
        if value.denominator != 1
        else str(value.numerator)
    )
    return sign + text


def _strip_unit(s: str) -> str:
    """``s`` without a trailing unit word after a number (``15 cm``, ``24 square meters``)."""
    match = _UNIT_WORD.search(s)
    if match and match.start() > 0 and re.search(r"[\d}]\s*$", s[: match.start()]):
        return s[: match.start()].rstrip()
    return s


_PERCENT = re.compile(r"\s*(?:\\%|%|\\text\{\s*percent\s*\}|\s+percent)\s*$")


def percent_variants(answer: str, label: str) -> list[tuple[str, str]]:
    """Pairs to compare for a percentage: both signs dropped when both sides have one; against a label
    without one, the bare number (``5\\%`` for ``5``) or the fraction (``5\\%`` for ``0.05``)."""
    a_pct, l_pct = _PERCENT.search(answer), _PERCENT.search(label)
    a, lab = _PERCENT.sub("", answer), _PERCENT.sub("", label)
    if a_pct and l_pct or not (a_pct or l_pct):
        return [(a, lab)]
    if a_pct:
        return [(a, lab), (f"\\frac{{{a}}}{{100}}", lab)]
    return [(a, lab), (a, f"\\frac{{{lab}}}{{100}}")]
