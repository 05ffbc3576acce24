"""Reading the files a run saved (``state.json``, checkpoint metadata): one that is damaged is an error
naming it, never a bare ``JSONDecodeError``/``KeyError`` traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import CheckpointError


def read_json(path: Path, *keys: str) -> dict[str, Any]:
    """The JSON object in ``path``, which must hold ``keys``; :class:`CheckpointError` naming the file
    otherwise."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(
            f"{path} cannot be read ({type(exc).__name__}: {exc}); is it damaged?"
        ) from None
    missing = [key for key in keys if key not in value] if isinstance(value, dict) else list(keys)
    if not isinstance(value, dict) or missing:
        raise CheckpointError(
            f"{path} is damaged or not written by rlsdk: no {', '.join(missing) or 'object'}"
        )
    return value
