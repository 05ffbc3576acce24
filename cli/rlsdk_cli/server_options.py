"""The options the serving commands share (``rlsdk serve``, ``buffer serve``, ``tinker serve``, ``view``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer

ALLOWED_HOST: Any = typer.Option(
    [],
    "--allowed-host",
    help="Host name clients may reach the server by besides loopback names (repeatable; other Host headers "
    "get 421, against DNS rebinding).",
)
ENGINE_SETTINGS: Any = typer.Option(
    [],
    "--set",
    help="KEY=VALUE: any engine setting, the engine plugin's own included (e.g. sglang_url for --engine sglang).",
)


def max_connections(default: int) -> Any:
    """``--max-connections``, ``default`` unless given."""
    return typer.Option(
        default, "--max-connections", min=1, help="Open connections at once; more are answered 503."
    )


def secret(flag: str, envvar: str, meaning: str) -> Any:
    """A secret clients must send, from ``flag`` or the environment variable ``envvar``."""
    return typer.Option(None, flag, envvar=envvar, help=meaning)


@contextmanager
def serving_errors(host: str, port: int) -> Iterator[None]:
    """A bad configuration, or an address the server cannot listen on, as one red line and exit status 2."""
    from rlsdk.errors import RlsdkError

    try:
        yield
    except (RlsdkError, ValueError) as exc:
        typer.secho(f"error: {exc}", err=True, fg="red")
        raise typer.Exit(2) from None
    except OSError as exc:
        typer.secho(f"error: cannot listen on {host}:{port}: {exc}", err=True, fg="red")
        raise typer.Exit(2) from exc
