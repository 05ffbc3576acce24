"""The hook implementation that registers the embedded engine (torch and transformers load when it is built)."""

from __future__ import annotations

from typing import Any

from rlsdk import Engine, hookimpl


def embedded(args: Any) -> Any:
    """SmolLM2-135M-Instruct (or ``--model``) in process on transformers: CPU or CUDA, no server needed."""
    from .engine import EmbeddedEngine

    return EmbeddedEngine(args.model, device=args.engine_device, dtype=args.engine_dtype,
                          max_batch_size=args.engine_max_batch_size, cache_dir=args.model_cache_dir,
                          threads=args.engine_threads, static_decode=args.engine_static_decode)


@hookimpl
def rlsdk_engines():
    yield Engine(name="embedded", func=embedded)
