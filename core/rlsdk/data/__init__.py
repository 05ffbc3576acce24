"""Prompt data for rollouts: the data source with its buffer, and the readers behind it. Internal: plugins
import the public names from ``rlsdk``."""

from .prompts import Prompt, PromptBuilder
from .rows import BadRowPolicy, DataPath, Row, read_rows
from .source import START_ROLLOUT_ID, DataSource

__all__ = [
    "START_ROLLOUT_ID",
    "BadRowPolicy",
    "DataPath",
    "DataSource",
    "Prompt",
    "PromptBuilder",
    "Row",
    "read_rows",
]
