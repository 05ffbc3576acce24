"""``tool_agent_answer``: 1 when the agent's final answer names the label, read from its result."""

from __future__ import annotations

import re
from typing import Any


def tool_agent_answer(args: Any, sample: Any, **kwargs: Any) -> float:
    """1.0 when the answer the agent returned contains the label as a whole word (case-insensitive)."""
    result = (sample.metadata.get("agent") or {}).get("result") or {}
    answer = result.get("answer") if isinstance(result, dict) else None
    if not answer or sample.label is None:
        return 0.0
    return float(
        re.search(rf"(?<![\w.]){re.escape(str(sample.label).lower())}(?![\w])", answer.lower()) is not None
    )
