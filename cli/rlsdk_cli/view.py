"""``rlsdk view``: a local web page for run folders. The server's modules load only when it starts, so
``rlsdk --help`` and ``rlsdk plugins list`` stay fast."""

from __future__ import annotations

import asyncio
import errno
import secrets
import signal
from pathlib import Path

import typer

from . import server_options as options

DEFAULT_PORT = 8420
PORTS_TRIED = 20
"""With the default port taken, the next ones are tried (a second viewer); a port given is used or fails."""


def view(
    folders: list[Path] = typer.Argument(
        ...,
        metavar="RUN_DIR...",
        help="Run folders (a run's --output), or folders holding run folders.",
        show_default=False,
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; loopback by default."),
    port: int | None = typer.Option(
        None, "--port", help=f"Port to listen on (default {DEFAULT_PORT} or the next free one; 0: any)."
    ),
    token: str | None = options.secret(
        "--token",
        "RLSDK_VIEW_TOKEN",
        "The secret the page's URL carries (default: a new random one each start).",
    ),
    allowed_host: list[str] = options.ALLOWED_HOST,
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        help="Model folder (or tokenizer.json) whose tokenizer shows token ids as text (default: the run's).",
    ),
) -> None:
    """Look at runs in a web page: curves, steps, groups, samples (text, tokens, log-probs, loss mask),
    agent trajectories, search, and two evals side by side. It reads the folders as runs write them."""
    from rlsdk.view.runs import RunFolder, ViewError, find_runs

    try:
        runs = [RunFolder(folder, i, tokenizer) for i, folder in enumerate(find_runs(folders))]
    except ViewError as exc:
        typer.secho(f"error: {exc}", err=True, fg="red")
        raise typer.Exit(2) from None
    try:
        asyncio.run(_serve(runs, host, port, token or secrets.token_urlsafe(24), allowed_host))
    except ValueError as exc:
        typer.secho(f"error: {exc}", err=True, fg="red")
        raise typer.Exit(2) from None


async def _serve(runs: list, host: str, port: int | None, token: str, allowed_hosts: list[str]) -> None:
    from rlsdk.view.server import start_view

    ports = [port] if port is not None else list(range(DEFAULT_PORT, DEFAULT_PORT + PORTS_TRIED))
    for candidate in ports:
        try:
            server = await start_view(runs, host, candidate, token=token, allowed_hosts=allowed_hosts)
            break
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or candidate == ports[-1]:
                raise typer.BadParameter(f"cannot listen on {host}:{candidate}: {exc.strerror}") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # before the address is printed: whoever reads it may stop us
        loop.add_signal_handler(sig, stop.set)
    names = ", ".join(run.name for run in runs)
    typer.echo(f"rlsdk view: {len(runs)} run{'s' if len(runs) != 1 else ''} ({names})")
    typer.echo(f"open {server.url}   (Ctrl-C stops)")
    try:
        await stop.wait()
    finally:
        await server.close()
