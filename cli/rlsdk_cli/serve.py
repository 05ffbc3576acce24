"""``rlsdk serve``: an engine plugin (the embedded engine by default) over HTTP with SGLang's native endpoints."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import typer

from . import server_options as options


def serve(
    engine: str = typer.Option(
        "embedded",
        "--engine",
        help="The engine plugin to serve, by name (`rlsdk plugins list --kind engine`) or dotted path.",
    ),
    model: str | None = typer.Option(
        None, "--model", help="Local Hugging Face model folder; default SmolLM2-135M-Instruct."
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on; anything but loopback needs a token."
    ),
    port: int = typer.Option(30000, "--port", help="Port to listen on (0 picks a free one)."),
    device: str | None = typer.Option(None, "--device", help="auto, cpu or cuda (engine_device)."),
    dtype: str | None = typer.Option(
        None, "--dtype", help="float32 (exact log-probs) or bfloat16 (engine_dtype)."
    ),
    max_batch_size: int | None = typer.Option(None, "--max-batch-size", help="Requests decoded together."),
    cache_dir: Path | None = typer.Option(
        None, "--cache-dir", help="Folder for the converted default model."
    ),
    threads: int | None = typer.Option(
        None, "--threads", help="CPU threads for torch (default: all cores but one)."
    ),
    static_decode: bool | None = typer.Option(
        None, "--static-decode/--no-static-decode", help="Decode over fixed buffers (CUDA graphs on CUDA)."
    ),
    settings: list[str] = options.ENGINE_SETTINGS,
    token: str | None = options.secret(
        "--token", "RLSDK_SERVE_TOKEN", "Bearer token required from clients (needed off loopback)."
    ),
    max_connections: int = options.max_connections(1024),
    allow_weights_dir: list[Path] = typer.Option(
        [],
        "--allow-weights-dir",
        help="Folder /update_weights_from_disk may load from (repeatable; none: refused).",
    ),
    tool_call_parser: str = typer.Option(
        "auto",
        "--tool-call-parser",
        help="How /v1/chat/completions reads tool calls: json, hermes, auto, or a plugin.",
    ),
    allowed_host: list[str] = options.ALLOWED_HOST,
    upstream: str | None = typer.Option(
        None,
        "--upstream",
        help="Serve only /v1/chat/completions and sessions, in front of this SGLang server or "
        "router URL (--model names its tokenizer's folder).",
    ),
) -> None:
    """Serve the embedded engine with SGLang's protocol (/generate, /model_info, /abort_request, ...) and an
    OpenAI-compatible /v1/chat/completions that records token-exact sessions."""
    from rlsdk import get_plugin_manager
    from rlsdk.engines.protocol import SERVE_TOKEN_ENV
    from rlsdk.engines.service_guard import check_binding
    from rlsdk.plugins.calls import call_engine

    flags = {
        "model": model,
        "engine_device": device,
        "engine_dtype": dtype,
        "engine_max_batch_size": max_batch_size,
        "model_cache_dir": str(cache_dir) if cache_dir else None,
        "engine_threads": threads,
        "engine_static_decode": static_decode,
    }
    with options.serving_errors(host, port):
        check_binding("rlsdk serve", host, token, SERVE_TOKEN_ENV)
        if upstream is not None:
            if model is None:
                raise ValueError("--upstream needs --model: the served model's tokenizer folder")
            asyncio.run(
                _serve_chat(
                    upstream,
                    model,
                    host,
                    port,
                    tool_call_parser,
                    token=token,
                    max_connections=max_connections,
                    allowed_hosts=allowed_host,
                )
            )
            return
        args = engine_args(flags, settings)
        pm = get_plugin_manager()
        built = call_engine(pm.resolve("engine", engine), args)
        asyncio.run(
            _serve(
                built,
                host,
                port,
                token=token,
                weights_dirs=allow_weights_dir,
                max_connections=max_connections,
                allowed_hosts=allowed_host,
                pm=pm,
                tool_call_parser=tool_call_parser,
            )
        )


def engine_args(flags: dict[str, Any], settings: list[str]) -> Any:
    """The run configuration the engine factory reads: the given flags, then ``--set`` (checked, as a run's)."""
    from rlsdk import RolloutConfig

    from .run import parse_set

    values = {k: v for k, v in flags.items() if v is not None}
    return RolloutConfig.from_dict({**values, **parse_set(settings)})


async def _serve(engine: Any, host: str, port: int, **server_options: Any) -> None:
    from rlsdk.run.engine_server import start_server
    from rlsdk.runtime import tuned_garbage_collector

    await engine.start()
    handle = await start_server(engine, host, port, **server_options)
    info = await engine.model_info()
    typer.echo(f"rlsdk serve: {info['model_path']} at {handle.url} (Ctrl-C stops)", err=True)
    try:
        with tuned_garbage_collector():
            await _until_stopped()
    finally:
        await handle.close()
        await engine.close()


async def _serve_chat(
    upstream: str,
    tokenizer_folder: str,
    host: str,
    port: int,
    tool_call_parser: str,
    **server_options: object,
) -> None:
    """The chat endpoint in front of an SGLang-protocol server."""
    from transformers import AutoTokenizer

    from rlsdk.agents.server import chat_endpoint, start_chat_server
    from rlsdk.engines.sglang_client import SGLangClient

    engine = SGLangClient(upstream)
    await engine.start()
    try:
        chat = await chat_endpoint(
            engine, AutoTokenizer.from_pretrained(tokenizer_folder), tool_call_parser=tool_call_parser
        )
        server = await start_chat_server(chat, host, port, **server_options)  # type: ignore[arg-type]
        typer.echo(
            f"rlsdk serve: /v1/chat/completions for {upstream} at {server.url} (Ctrl-C stops)", err=True
        )
        try:
            await _until_stopped()
        finally:
            await server.close()
    finally:
        await engine.close()


async def _until_stopped() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
