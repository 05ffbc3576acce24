"""The embedded engine: SGLang's protocol answered in process by transformers (CPU or CUDA).

``default_model_path()`` is light to import; ``EmbeddedEngine`` imports torch and transformers on
first access."""

from __future__ import annotations

from typing import Any

from .model_files import ModelNotFoundError, cache_root, default_model_path, resolve_model_path

__all__ = ["EmbeddedEngine", "ModelNotFoundError", "cache_root", "default_model_path", "resolve_model_path"]


def __getattr__(name: str) -> Any:
    if name == "EmbeddedEngine":
        from .engine import EmbeddedEngine

        return EmbeddedEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
