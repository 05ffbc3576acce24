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
    """A real SGLang server or router by URL, or one launched with ``python -m sglang.launch_server``."""
    from rlsdk.engine import SGLangClient

    options = {"concurrency": args.sglang_server_concurrency, "retries": args.sglang_retries}
    if args.sglang_launch:
        model = args.model or args.hf_checkpoint
        if not model:
            raise ValueError("sglang_launch needs --model: the model folder SGLang should serve")
        return SGLangClient.launching(model, host=args.sglang_router_ip or "127.0.0.1",
                                      port=args.sglang_router_port or 30000, python=args.sglang_python, **options)
    url = args.sglang_url or (args.engine if args.engine.startswith(("http://", "https://")) else None)
    if not url:
        if not (args.sglang_router_ip and args.sglang_router_port):
            raise ValueError("the sglang engine needs --sglang-url (or sglang_router_ip and sglang_router_port)")
        url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
    return SGLangClient(url, **options)


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
