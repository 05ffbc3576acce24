"""Finding the final answer of a response: the last ``\\boxed{}``, else "the answer is X", else the
result at the end of the last sentence that holds math. Only the final answer counts: a reply that ends by
repeating the question (``6 + 5 = ?``) or an unevaluated sum (``the answer is 6 + 5``, ``\\boxed{6 + 5}``,
``we compute 0 + 4``) has none."""

from __future__ import annotations

import re

from rlsdk import boxed_contents

TAIL_CHARS = 1500
"""Without a box, only the end of the response is searched for the final answer."""

_THINK_END = "</think>"
_ANSWER_IS = re.compile(r"(?i)\banswer\s*(?:is|:|=)\s*:?\s*(?:\*\*)?\s*")
_DELIMITED = re.compile(r"^\s*(?:\$\$?([^$]{1,300})\$\$?|\\\((.{1,300}?)\\\)|\\\[(.{1,300}?)\\\])")
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")
_SENTENCE_END = re.compile(r"(?<!\d)[.!?](?!\d)|\n")
_SENTENCE = re.compile(
    r"(?:[^.!?\n]+|(?<=\d)\.(?=\d))+(?:[.!?]|\n|$)"
)  # runs, not single characters: 5x faster
_ARITHMETIC = re.compile(r"^\s*[-+]?\d[\d.,]*(?:\s*(?:[-+*/×÷·]|\\times|\\cdot|\\div)\s*[-+]?\d[\d.,]*)+\s*$")
_OPERATOR_BEFORE = re.compile(r"(?:[-+*/×÷·]|\\times|\\cdot|\\div|\b(?:plus|minus|times))\s*$")
_LIST_SEPARATOR = re.compile(r",|\\pm|\\mp")
_FRACTION = re.compile(r"^\s*[-+]?\d+\s*/\s*\d+\s*$")
_MATHY = re.compile(r"\d|\\[a-zA-Z]|\$")


def answer_candidates(response: str) -> list[str]:
    """Answers to grade, best first: the last box, then (if the response boxes several different
    answers) all of them together as math-verify reads them; without a box, the one final answer found
    in text. Empty when there is no final answer."""
    text = response.rsplit(_THINK_END, 1)[-1] if _THINK_END in response else response
    boxed = [b for b in boxed_contents(text) if not _is_echo(b)]
    if boxed:
        candidates = [boxed[-1]]
        if len(set(boxed)) > 1:
            candidates.append(", ".join(boxed))
        return [c for c in candidates if c]
    answer = text_answer(text[-TAIL_CHARS:])
    return [answer] if answer else []


def is_list(label: str) -> bool:
    """Whether a label holds several answers (``2, 3``, ``\\pm 2``), which several boxes may give."""
    return bool(_LIST_SEPARATOR.search(label))


def _is_echo(answer: str) -> bool:
    """An unevaluated sum, difference, product or quotient of plain numbers: the question, not an answer."""
    return bool(_ARITHMETIC.match(answer)) and not _FRACTION.match(answer)


def text_answer(text: str) -> str | None:
    """The final answer of unboxed text, or None."""
    text = text.replace("\\$", "")  # an escaped dollar is currency, not a math delimiter
    # the case-insensitive scan is the slow part; casefold() maps every letter it matches (ſ, say) to ASCII
    matches = list(_ANSWER_IS.finditer(text)) if "answer" in text.casefold() else []
    if matches:
        return _clean(_first_sentence(text[matches[-1].end() :]))
    for sentence in reversed(_SENTENCE.findall(text)):
        if sentence.rstrip().endswith("?"):
            continue  # a question, often the prompt repeated: not an answer
        if _MATHY.search(sentence):
            if "=" in sentence:
                return _clean(sentence.rsplit("=", 1)[1])
            delimited = re.findall(r"\$([^$]{1,300})\$", sentence)
            if delimited:
                return _clean(delimited[-1])
            numbers = list(_NUMBER.finditer(sentence))
            if not numbers or _OPERATOR_BEFORE.search(sentence[: numbers[-1].start()]):
                return None  # no number, or the last one is an operand: "we compute 0 + 4"
            return numbers[-1].group(0)
    return None


def _first_sentence(text: str) -> str:
    delimited = _DELIMITED.match(text)
    if delimited:
        return next(g for g in delimited.groups() if g is not None)
    return _SENTENCE_END.split(text, 1)[0]


def _clean(span: str) -> str | None:
    """The answer in a span that should start with one: a delimited expression, a number, or short math;
    None for an unevaluated sum of numbers or a span without math."""
    span = span.strip().strip("$").strip().rstrip(".,;:")
    if "=" in span:
        span = span.rsplit("=", 1)[1].strip()
    if not span or not _MATHY.search(span) or (_ARITHMETIC.match(span) and not _FRACTION.match(span)):
        return None
    number = _NUMBER.match(span)
    if number and not re.match(r"\s*(?:[-+*/^_{}()\\]|[a-zA-Z](?![a-zA-Z]))", span[number.end() :]):
        return number.group(0)  # "11 apples", "11 because ..." -> "11"
    return span if len(span) <= 100 else None
