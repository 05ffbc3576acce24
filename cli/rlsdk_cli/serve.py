"""``rlsdk serve``: the embedded engine over HTTP with SGLang's native endpoints."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import typer


def serve(
    model: str | None = typer.Option(None, "--model", help="Local Hugging Face model folder; default SmolLM2-135M-Instruct."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; anything but loopback needs a token."),
    port: int = typer.Option(30000, "--port", help="Port to listen on (0 picks a free one)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    dtype: str = typer.Option("float32", "--dtype", help="float32 (exact log-probs) or bfloat16."),
    max_batch_size: int = typer.Option(64, "--max-batch-size", help="Requests decoded together."),
    cache_dir: Path | None = typer.Option(None, "--cache-dir", help="Folder for the converted default model."),
    threads: int | None = typer.Option(None, "--threads", help="CPU threads for torch (default: all cores but one)."),
    token: str | None = typer.Option(None, "--token", envvar="RLSDK_SERVE_TOKEN",
                                     help="Bearer token required from clients (needed off loopback)."),
    max_connections: int = typer.Option(1024, "--max-connections", min=1,
                                        help="Open connections at once; more are answered 503."),
    allow_weights_dir: list[Path] = typer.Option(
        [], "--allow-weights-dir", help="Folder /update_weights_from_disk may load from (repeatable; none: refused)."),
    tool_call_parser: str = typer.Option(
        "auto", "--tool-call-parser", help="How /v1/chat/completions reads tool calls: json, hermes, auto, or a plugin."),
    upstream: str | None = typer.Option(
        None, "--upstream", help="Serve only /v1/chat/completions and sessions, in front of this SGLang server or "
        "router URL (--model names its tokenizer's folder)."),
) -> None:
    """Serve the embedded engine with SGLang's protocol (/generate, /model_info, /abort_request, ...) and an
    OpenAI-compatible /v1/chat/completions that records token-exact sessions."""
    from rlsdk.protocol import SERVE_TOKEN_ENV
    from rlsdk.service_guard import check_binding
    from rlsdk_generators.embedded import EmbeddedEngine, ModelNotFoundError

    try:
        check_binding("rlsdk serve", host, token, SERVE_TOKEN_ENV)
    except ValueError as exc:
        typer.secho(f"error: {exc}", err=True, fg="red")
        raise typer.Exit(2) from None
    if upstream is not None:
        if model is None:
            typer.secho("error: --upstream needs --model: the served model's tokenizer folder", err=True, fg="red")
            raise typer.Exit(2)
        asyncio.run(_serve_chat(upstream, model, host, port, tool_call_parser, token=token,
                                max_connections=max_connections))
        return
    engine = EmbeddedEngine(model, device=device, dtype=dtype, max_batch_size=max_batch_size, cache_dir=cache_dir,
                            threads=threads)
    try:
        asyncio.run(_serve(engine, host, port, token=token, weights_dirs=allow_weights_dir,
                           max_connections=max_connections, tool_call_parser=tool_call_parser))
    except ModelNotFoundError as exc:
        typer.secho(f"error: {exc}", err=True, fg="red")
        raise typer.Exit(2) from exc
    except OSError as exc:
        typer.secho(f"error: cannot listen on {host}:{port}: {exc}", err=True, fg="red")
        raise typer.Exit(2) from exc


async def _serve(engine: object, host: str, port: int, **server_options: object) -> None:
    from rlsdk.runtime import tuned_garbage_collector
    from rlsdk.serve import start_server

    await engine.start()  # type: ignore[attr-defined]
    handle = await start_server(engine, host, port, **server_options)  # type: ignore[arg-type]
    info = await engine.model_info()  # type: ignore[attr-defined]
    typer.echo(f"rlsdk serve: {info['model_path']} at {handle.url} (Ctrl-C stops)", err=True)
    try:
        with tuned_garbage_collector():
            await _until_stopped()
    finally:
        await handle.close()
        await engine.close()  # type: ignore[attr-defined]


async def _serve_chat(upstream: str, tokenizer_folder: str, host: str, port: int, tool_call_parser: str,
                      **server_options: object) -> None:
    """The chat endpoint in front of an SGLang-protocol server."""
    from transformers import AutoTokenizer

    from rlsdk.agents.server import chat_endpoint, start_chat_server
    from rlsdk.engine import SGLangClient

    engine = SGLangClient(upstream)
    await engine.start()
    try:
        chat = await chat_endpoint(engine, AutoTokenizer.from_pretrained(tokenizer_folder),
                                   tool_call_parser=tool_call_parser)
        server = await start_chat_server(chat, host, port, **server_options)  # type: ignore[arg-type]
        typer.echo(f"rlsdk serve: /v1/chat/completions for {upstream} at {server.url} (Ctrl-C stops)", err=True)
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
