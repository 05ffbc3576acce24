"""The hook implementation that registers the embedded engine (torch and transformers load when it is built)."""

from __future__ import annotations

import os
from typing import Any

from rlsdk import Engine, Option, hookimpl


def embedded(args: Any) -> Any:
    """SmolLM2-135M-Instruct (or ``--model``, else slime's ``--hf-checkpoint``) in process on transformers: CPU
    or CUDA, no server needed. Deterministic mode (``--deterministic``) runs one request at a time: a batch
    formed as requests arrive changes a row's log-probs in the last bits."""
    from .engine import EmbeddedEngine

    return EmbeddedEngine(
        args.model or args.hf_checkpoint,
        device=args.engine_device,
        dtype=args.engine_dtype,
        max_batch_size=1 if args.sglang_enable_deterministic_inference else args.engine_max_batch_size,
        cache_dir=args.model_cache_dir,
        threads=engine_threads(args),
        static_decode=args.engine_static_decode,
    )


def engine_threads(args: Any) -> int | None:
    """``engine_threads``; else every core in a ``--train`` run in this process (the trainer waits while the
    engine generates, so nothing else needs a core); else the engine's default (all cores but one)."""
    if args.engine_threads:
        return args.engine_threads
    if getattr(args, "train", False) and not getattr(args, "ray_address", None):
        return len(os.sched_getaffinity(0))
    return None


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
        help="Rows the embedded engine decodes together; further requests wait (1 under --deterministic).",
    )
    yield Option(
        "engine_static_decode",
        bool,
        help="Embedded engine: decode steps over fixed cache buffers, "
        "replayed from CUDA graphs on CUDA (default there for models whose layers all attend to the "
        "whole context); false: every step eager.",
    )
    yield Option(
        "engine_threads",
        int,
        help="CPU threads for the embedded engine's torch; default all cores but one, and every core in "
        "a --train run off Ray (the trainer waits while the engine generates).",
    )
    yield Option(
        "model_cache_dir",
        str,
        help="Folder for the embedded engine's converted default model; default "
        "$RLSDK_CACHE_DIR/models or ~/.cache/rlsdk/models.",
    )
