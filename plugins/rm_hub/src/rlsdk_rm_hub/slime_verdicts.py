"""The string side of slime's reward hub, one pure function per rule, so that ``slime_math``,
``deepscaler``, ``dapo`` and ``gpqa`` give slime's verdicts, quirks included (users reproduce published
slime runs with them). The sympy side runs in grading workers (:mod:`.slime_sympy`).

Quirks kept on purpose: only ``\\boxed{`` answers are graded (an ``\\fbox`` is found but not unwrapped);
deepscaler grades what follows the *last* ``</think>`` but the *first* ``###Response``; an empty label
scores 0; DAPO reads ``Answer:`` in the last 300 characters and compares as integers.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from typing import Any

from .normalize import minerva_normalize

# ----- boxed answers ----------------------------------------------------------------------------------


def last_boxed_span(text: str, fbox: bool = True) -> str | None:
    """The last ``\\boxed...`` (else, with ``fbox``, ``\\fbox...``) with everything up to the brace that
    closes the first ``{`` after it; None when there is none or the braces never balance. With ``fbox``
    the marker is ``\\boxed`` (math_utils), without it ``\\boxed{`` (math_dapo_utils)."""
    start = text.rfind("\\boxed" if fbox else "\\boxed{")
    if start < 0 and fbox:
        start = text.rfind("\\fbox")
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def unbox(span: str | None) -> str | None:
    """The inside of ``\\boxed{...}``; None for anything else (an ``\\fbox{}`` included)."""
    if span is None or not span.startswith("\\boxed{") or not span.endswith("}"):
        return None
    return span[len("\\boxed{") : -1]


def boxed_answer(passage: str) -> str | None:
    """slime's ``extract_answer``: the last boxed answer, only when ``\\boxed`` occurs at all."""
    return unbox(last_boxed_span(passage)) if "\\boxed" in passage else None


# ----- math and deepscaler ----------------------------------------------------------------------------


def deepscaler_solution(response: str) -> str | None:
    """The part deepscaler grades: after the last ``</think>``, else between the first and second
    ``###Response``; None when neither marker is there (the reward is then 0)."""
    if "</think>" in response:
        return response.split("</think>")[-1]
    if "###Response" in response:
        return response.split("###Response")[1]
    return None


def gold_answer(label: Any, falsy_is_empty: bool = False) -> str | None:
    """A label as slime compares it: as a string, its last boxed answer when it holds one; None when it
    cannot match (empty, or a box that does not close; with ``falsy_is_empty``, as slime's ``math``, also
    ``0``)."""
    if (not label) if falsy_is_empty else label == "":
        return None
    text = str(label)
    return boxed_answer(text) if "\\boxed" in text else text


# ----- dapo -------------------------------------------------------------------------------------------

DAPO_TAIL_CHARS = 300
STRICT_BOX_TAIL_CHARS = 100
MINERVA_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


def minerva_correct(solution: str, gold: Any) -> tuple[bool, str]:
    """The last ``Answer: ...`` line, normalized, against the normalized label read as an integer (DAPO's
    labels are integers: ``42.0`` is ``42``; a label that is no number raises ValueError)."""
    found = MINERVA_ANSWER.findall(solution)
    pred = minerva_normalize(found[-1] if found else "[INVALID]")
    try:
        gold_integer = str(int(float(minerva_normalize(gold))))
    except ValueError:
        raise ValueError(
            f"dapo compares integer labels, as slime's DAPO does; {gold!r} is not a number "
            "(grade other answers with the 'math' reward)"
        ) from None
    return pred == gold_integer, pred


def strict_box_correct(solution: str, gold: Any) -> tuple[int, str | None]:
    """The last ``\\boxed{}`` of ``solution``, unnormalized, against the label: 1 or -1."""
    span = last_boxed_span(solution, fbox=False)
    pred = span[len("\\boxed{") : -1] if span is not None else None
    return (1 if pred == gold else -1), pred


def dapo_score(response: str, gold: Any, strict_box: bool = False) -> dict[str, Any]:
    """DAPO's reward on the last 300 characters: ``{"score": 1.0 or -1.0, "acc": bool, "pred": ...}``."""
    tail = response[-DAPO_TAIL_CHARS:]
    if strict_box:
        verdict, pred = strict_box_correct(tail[-STRICT_BOX_TAIL_CHARS:], gold)
        correct = verdict == 1
    else:
        correct, pred = minerva_correct(tail, gold)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}


# ----- gpqa -------------------------------------------------------------------------------------------

GPQA_LETTERS = list(string.ascii_uppercase[:10])
_LETTER_PATTERNS = (
    re.compile(r"(?:answer|option|choice)\s*(?:is|:)?\s*([A-Z])", re.IGNORECASE),
    re.compile(r"([A-Z])\s*(?:is\s*(?:the)?\s*correct)", re.IGNORECASE),
    re.compile(r"final\s*(?:answer|option)\s*(?:is|:)?\s*([A-Z])", re.IGNORECASE),
)
_STANDALONE_CAPITAL = re.compile(r"\b([A-Z])\b")
_NOT_ALNUM = re.compile(r"[^a-z0-9]+")


def after_thinking(text: str | None) -> str:
    """The text after the last ``</think>`` (all of it when there is none)."""
    return (text or "").rsplit("</think>", 1)[-1]


def _plain(text: str) -> str:
    return _NOT_ALNUM.sub(" ", text.lower()).strip()


def gpqa_letter(response: str | None, valid_letters: Iterable[str]) -> str | None:
    """The chosen option: the first hit of "answer/option/choice is X", then "X is correct", then "final
    answer X" (case-insensitive, only when X is valid), else the last valid standalone capital letter."""
    if not response:
        return None
    text = after_thinking(response)
    valid = {letter.upper() for letter in valid_letters}
    for pattern in _LETTER_PATTERNS:
        match = pattern.search(text)
        if match and match.group(1).upper() in valid:
            return match.group(1).upper()
    return next((c for c in reversed(_STANDALONE_CAPITAL.findall(text)) if c in valid), None)


def gpqa_reward(response: str | None, label: Any, metadata: dict | None = None) -> float:
    """GPQA: the chosen letter against ``metadata.correct_letter``, a one-letter label, an integer label
    (an index into the letters) or the choice whose text is the label; without a letter in the response,
    1.0 when the response contains the correct choice's text."""
    if response is None:
        return 0.0
    metadata = metadata or {}
    choices = metadata.get("choices")
    choices = (
        list(choices.values()) if isinstance(choices, dict) else None if choices is None else list(choices)
    )
    letters = [str(x).upper() for x in metadata.get("valid_letters") or []] or (
        list(string.ascii_uppercase[: len(choices)]) if choices else GPQA_LETTERS
    )
    correct = metadata.get("correct_letter")
    correct = correct.strip().upper() if isinstance(correct, str) else None
    label_text = label.strip() if isinstance(label, str) else None
    if label_text is not None and len(label_text) == 1 and label_text.upper() in letters and not correct:
        correct = label_text.upper()
    elif isinstance(label, (int, float)) and 0 <= int(label) < len(letters):
        correct = letters[int(label)]
    extra = {}
    if not correct and choices and label_text:
        index = next((i for i, c in enumerate(choices) if _plain(str(c)) == _plain(label_text)), None)
        if index is not None:
            correct = letters[index]
            extra["correct_answer"] = choices[index]
    chosen = gpqa_letter(response, letters)
    if chosen and correct:
        return 1.0 if chosen == correct else 0.0
    targets = []
    if correct and choices and correct in letters and letters.index(correct) < len(choices):
        targets.append(str(choices[letters.index(correct)]))
    for key in ("correct_answer", "answer_text"):
        value = metadata.get(key, extra.get(key))
        if value:
            targets.append(str(value))
    if label_text:
        targets.append(label_text)
    said = _plain(after_thinking(response))
    if any(_plain(t) and _plain(t) in said for t in targets if t):
        return 1.0
    if chosen and not correct and label_text:
        return 1.0 if chosen == label_text.upper() else 0.0
    return 0.0
