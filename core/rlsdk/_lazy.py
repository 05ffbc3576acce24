"""Public names whose modules are heavy to import (torch, aiohttp): loaded on first use, so that importing
a public module stays fast where they are absent (``rlsdk plugins list``)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

from ._moved import forward


def lazy_module_hooks(
    namespace: dict[str, Any], lazy: dict[str, str], moved: dict[str, str] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module's ``__getattr__`` and ``__dir__``: ``lazy`` names (name -> the module defining it) load on
    first access and stay (``"module:attribute"`` where the name differs there); ``moved`` names (name -> the public module it moved to) forward with a
    ``DeprecationWarning`` naming their replacement."""
    moved = moved or {}

    def __getattr__(name: str) -> Any:
        if name in lazy:
            module, _, attribute = lazy[name].partition(":")
            value = getattr(import_module(module), attribute or name)
            namespace[name] = value
            return value
        if name in moved:
            return forward(namespace["__name__"], moved, removed_in="0.4")(name)
        raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(lazy))

    return __getattr__, __dir__
