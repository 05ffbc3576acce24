"""``rlsdk tinker serve``: the Tinker-compatible training API."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from . import server_options as options

app = typer.Typer(
    help="A Tinker-compatible training API: tinker SDK recipes train on rlsdk (docs/tinker.md).",
    no_args_is_help=True,
)


@app.command()
def serve(
    model: list[str] = typer.Option(
        [],
        "--model",
        help="NAME=PATH: serve the local model folder PATH as the base model NAME (repeatable); default "
        "SmolLM2-135M-Instruct as HuggingFaceTB/SmolLM2-135M-Instruct.",
    ),
    engine: str = typer.Option("embedded", "--engine", help="The engine plugin that samples, by name."),
    settings: list[str] = options.ENGINE_SETTINGS,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", help="Port to listen on (0 picks a free one)."),
    api_key: str | None = options.secret(
        "--api-key",
        "RLSDK_TINKER_API_KEY",
        "The key clients send (TINKER_API_KEY, tml-...); default: a new one, printed.",
    ),
    checkpoint_dir: Path = typer.Option(
        Path("tinker-checkpoints"), "--checkpoint-dir", help="Where tinker:// checkpoints are kept."
    ),
    train_device: str = typer.Option("auto", "--train-device", help="auto, cpu or cuda."),
    train_dtype: str = typer.Option("auto", "--train-dtype", help="auto, float32 or bfloat16."),
    train_threads: int | None = typer.Option(None, "--train-threads", help="CPU threads for training."),
    sync_check_tol: float | None = typer.Option(
        None, "--sync-check-tol", help="Trust check tolerance in nats (default: 0.05 on CPU, 2 on CUDA)."
    ),
    seed: int | None = typer.Option(
        None,
        "--seed",
        help="Seed the samples of requests that give none (reproducible runs); default unseeded.",
    ),
    allowed_host: list[str] = options.ALLOWED_HOST,
) -> None:
    """Serve the Tinker API: recipes set TINKER_BASE_URL to this server and TINKER_API_KEY to its key."""
    import secrets

    from rlsdk import get_plugin_manager
    from rlsdk.plugins.calls import call_engine
    from rlsdk.tinker.names import parse_models
    from rlsdk.tinker.server import start_tinker_server
    from rlsdk.tinker.service import TinkerService
    from rlsdk.tinker.training import Placement

    from .serve import _until_stopped, engine_args

    with options.serving_errors(host, port):
        models = parse_models(model)
        key = api_key or f"tml-{secrets.token_urlsafe(24)}"
        if api_key is None:
            typer.echo(f"rlsdk tinker serve: export TINKER_API_KEY={key}", err=True)
        pm = get_plugin_manager()
        resolved = pm.resolve("engine", engine)

        def make_engine(folder: Path | None) -> object:
            flags = {"model": str(folder) if folder else None}
            return call_engine(resolved, engine_args(flags, settings))

        placement = Placement(train_device, train_dtype, train_threads, sync_check_tol)
        service = TinkerService(models, make_engine, checkpoint_dir, placement, seed)  # type: ignore[arg-type]

        async def main() -> None:
            server = await start_tinker_server(service, [key], host, port, allowed_hosts=allowed_host)
            typer.echo(
                f"rlsdk tinker serve: {', '.join(models)} at {server.url} (TINKER_BASE_URL; Ctrl-C stops)",
                err=True,
            )
            try:
                await _until_stopped()
            finally:
                await server.close()

        asyncio.run(main())
