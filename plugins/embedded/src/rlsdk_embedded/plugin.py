"""The hook implementation that registers the embedded engine (torch and transformers load when it is built)."""

from __future__ import annotations

from typing import Any

from rlsdk import Engine, Option, hookimpl


def embedded(args: Any) -> Any:
    """SmolLM2-135M-Instruct (or ``--model``) in process on transformers: CPU or CUDA, no server needed."""
    from .engine import EmbeddedEngine

    return EmbeddedEngine(
        args.model,
        device=args.engine_device,
        dtype=args.engine_dtype,
        max_batch_size=args.engine_max_batch_size,
        cache_dir=args.model_cache_dir,
        threads=args.engine_threads,
        static_decode=args.engine_static_decode,
    )


@hookimpl
def rlsdk_engines():
    yield Engine(name="embedded", func=embedded)


@hookimpl
def rlsdk_options():
    yield Option(
        "engine_device",
        str,
        "auto",
        choices=("auto", "cpu", "cuda"),
        help="Device of the embedded engine: auto (CUDA when available), cpu or cuda.",
    )
    yield Option(
        "engine_dtype",
        str,
        "float32",
        help="Weights dtype of the embedded engine; float32 keeps "
        "log-probs exact, bfloat16 is faster on GPU.",
    )
    yield Option(
        "engine_max_batch_size",
        int,
        64,
        help="Rows the embedded engine decodes together; further requests wait.",
    )
    yield Option(
        "engine_static_decode",
        bool,
        help="Embedded engine: decode steps over fixed cache buffers, "
        "replayed from CUDA graphs on CUDA (default there for models whose layers all attend to the "
        "whole context); false: every step eager.",
    )
    yield Option(
        "engine_threads", int, help="CPU threads for the embedded engine's torch; default all cores but one."
    )
    yield Option(
        "model_cache_dir",
        str,
        help="Folder for the embedded engine's converted default model; default "
        "$RLSDK_CACHE_DIR/models or ~/.cache/rlsdk/models.",
    )
