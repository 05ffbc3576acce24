"""Stands in for ``slime.utils.misc``."""

from __future__ import annotations

import functools
from typing import Any

from ..plugins.loading import load_callable

__all__ = ["load_function"]


@functools.cache
def load_function(path: str) -> Any:
    """The object at a dotted path (``pkg.mod.fn``), or ``pkg.mod:fn`` or ``file.py:fn``."""
    return load_callable(path)
