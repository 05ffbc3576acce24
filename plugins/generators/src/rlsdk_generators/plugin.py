"""The hook implementations that register the generators package's plugins.

Kept free of torch, transformers and httpx imports: engine factories import their engine when called."""

from __future__ import annotations

from typing import Any

from rlsdk import CustomGenerate, Engine, GenerateRollout, Tool, hookimpl

from rlsdk import generate, rollout

from . import calculator, multi_turn, rollout_buffer, sft


def embedded(args: Any) -> Any:
    """SmolLM2-135M-Instruct (or ``--model``) in process on transformers: CPU or CUDA, no server needed."""
    from .embedded import EmbeddedEngine

    return EmbeddedEngine(args.model, device=args.engine_device, dtype=args.engine_dtype,
                          max_batch_size=args.engine_max_batch_size, cache_dir=args.model_cache_dir,
                          threads=args.engine_threads, static_decode=args.engine_static_decode)


def sglang(args: Any) -> Any:
    """A real SGLang server or router by URL; without one, rlsdk launches SGLang servers (and a router)
    on this machine's GPUs for ``--hf-checkpoint`` (:mod:`rlsdk.launch.sglang`)."""
    from pathlib import Path

    from rlsdk.engine import SGLangClient

    options = {"concurrency": args.sglang_server_concurrency, "retries": args.sglang_retries}
    url = args.sglang_url
    if not url and args.sglang_router_ip and args.sglang_router_port and not args.sglang_launch:
        url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
    if url:
        return SGLangClient(url, **options)
    from rlsdk.launch.sglang import launcher_for

    launcher = launcher_for(args, Path(args.output_dir) / "logs")
    return SGLangClient(launcher.url, launcher=launcher, **options)


@hookimpl
def rlsdk_custom_generates():
    yield CustomGenerate(name="single_turn", func=generate.generate,
                         description="One /generate call through the run's engine (the default)")
    yield CustomGenerate(name="multi_turn", func=multi_turn.multi_turn)


@hookimpl
def rlsdk_generate_rollouts():
    yield GenerateRollout(name="sglang", func=rollout.generate_rollout,
                          description="Over-sampling rollout with dynamic filter, abort and partial rollouts")
    yield GenerateRollout(name="sft", func=sft.sft, chat_messages=True)
    yield GenerateRollout(name="rollout_buffer", func=rollout_buffer.rollout_buffer, chat_messages=True)


@hookimpl
def rlsdk_tools():
    yield Tool(
        name="calculator",
        func=calculator.calculator,
        parameters={"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
        timeout=5.0,
    )


@hookimpl
def rlsdk_engines():
    yield Engine(name="embedded", func=embedded)
    yield Engine(name="sglang", func=sglang)
