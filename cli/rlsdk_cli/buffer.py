"""``rlsdk buffer serve``: the rollout buffer service for agents that run outside the trainer."""

from __future__ import annotations

import asyncio
import os
import signal
import warnings
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path

import typer

from . import server_options as options

app = typer.Typer(help="The rollout buffer service (slime-compatible endpoints).", no_args_is_help=True)


@app.command("serve")
def serve(
    host: str = typer.Option("127.0.0.1", help="Address to bind; anything but loopback needs a token."),
    port: int = typer.Option(8889, help="Port (0 picks a free one)."),
    data_dir: str = typer.Option("rlsdk-buffer", help="Folder where accepted trajectories are appended."),
    token: str | None = options.secret(
        "--token", "RLSDK_BUFFER_TOKEN", "Bearer token required from clients."
    ),
    max_body_mb: float = typer.Option(64.0, help="Largest request body, in MiB."),
    max_held_mb: float = typer.Option(
        1024.0, min=1.0, help="MiB of trajectories held until a trainer takes them; more writes get 507."
    ),
    read_timeout: float = typer.Option(
        30.0, min=0.1, help="Seconds a connection may idle or take to send a request."
    ),
    max_connections: int = options.max_connections(256),
    allow_input_dir: list[str] = typer.Option(
        [],
        "--allow-input-dir",
        help="Folder a /start_rollout's input_file may name (repeatable; none: input_file refused).",
    ),
    allow_url_host: list[str] = typer.Option(
        [],
        "--allow-url-host",
        help="Host a /start_rollout's remote_buffer_url or remote_engine_url may name besides this "
        "service and loopback engines (repeatable).",
    ),
    allowed_host: list[str] = options.ALLOWED_HOST,
) -> None:
    """Serve /start_rollout, /buffer/write, /get_rollout_data and /ack_rollout_data; prints the URL once
    listening. Ctrl-C or SIGTERM stops it; every acknowledged item is already on disk."""
    from rlsdk import get_plugin_manager
    from rlsdk.errors import RlsdkError
    from rlsdk.locks import folder_lock
    from rlsdk.rollout.buffer_service import BufferService, TrajectoryStore, check_binding

    try:
        check_binding(host, token)
    except ValueError as exc:
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(2) from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = get_plugin_manager()
    options = {
        "token": token,
        "max_body": int(max_body_mb * (1 << 20)),
        "read_timeout": read_timeout,
        "max_connections": max_connections,
        "allowed_hosts": allowed_host,
    }
    with ExitStack() as held:
        try:  # one service per store: a second one would append to its files and serve its groups again
            held.enter_context(folder_lock(Path(data_dir), holder="rlsdk buffer serve", role="--data-dir"))
        except (RlsdkError, OSError) as exc:
            typer.echo(f"Error: {exc}", err=True)
            raise typer.Exit(1) from None
        store = TrajectoryStore(data_dir, max_held_bytes=int(max_held_mb * (1 << 20)))
        service = BufferService(pm, store, input_dirs=allow_input_dir, url_hosts=allow_url_host)
        try:
            asyncio.run(_serve(service, host, port, data_dir, options))
        except OSError as exc:
            typer.echo(f"Error: cannot listen on {host}:{port}: {exc}", err=True)
            raise typer.Exit(2) from None


async def _serve(service: object, host: str, port: int, data_dir: str, options: Mapping[str, object]) -> None:
    from rlsdk.rollout.buffer_service import start_buffer_server

    server = await start_buffer_server(service, host, port, **options)  # type: ignore[arg-type]
    counts = server.service.store.counts()
    typer.echo(
        f"rollout buffer on {server.url} (data in {os.path.abspath(data_dir)}, "
        f"{counts['pending_items']} items pending)"
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.close()
    typer.echo("rollout buffer stopped", err=True)
