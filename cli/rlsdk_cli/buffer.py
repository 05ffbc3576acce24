"""``rlsdk buffer serve``: the rollout buffer service for agents that run outside the trainer."""

from __future__ import annotations

import os
import warnings

import typer

app = typer.Typer(help="The rollout buffer service (slime-compatible endpoints).", no_args_is_help=True)


@app.command("serve")
def serve(
    host: str = typer.Option("127.0.0.1", help="Address to bind; anything but loopback needs a token."),
    port: int = typer.Option(8889, help="Port (0 picks a free one)."),
    data_dir: str = typer.Option("rlsdk-buffer", help="Folder where accepted trajectories are appended."),
    token: str | None = typer.Option(None, envvar="RLSDK_BUFFER_TOKEN",
                                     help="Bearer token required from clients."),
    max_body_mb: float = typer.Option(64.0, help="Largest request body, in MiB."),
) -> None:
    """Serve /start_rollout, /buffer/write and /get_rollout_data; prints the URL once listening."""
    from rlsdk import get_plugin_manager
    from rlsdk.rollout_buffer import BufferService, TrajectoryStore, check_binding, make_buffer_server

    try:
        check_binding(host, token)
    except ValueError as exc:
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(2) from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = get_plugin_manager()
    store = TrajectoryStore(data_dir)
    service = BufferService(pm, store)
    server = make_buffer_server(service, host, port, token=token, max_body=int(max_body_mb * (1 << 20)))
    counts = store.counts()
    typer.echo(f"rollout buffer on {service.url} (data in {os.path.abspath(data_dir)}, "
               f"{counts['pending_items']} items pending)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        server.server_close()
