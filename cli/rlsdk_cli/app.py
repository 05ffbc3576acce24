"""The typer app behind the ``rlsdk`` console script. Subcommands live in their own modules."""

from __future__ import annotations

import typer

from rlsdk import __version__

from . import buffer, plugins, run, score, serve

app = typer.Typer(
    name="rlsdk",
    help="rlsdk: installable plugins for LLM reinforcement-learning rollouts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(plugins.app, name="plugins")
app.command("run")(run.run)
app.command("eval")(run.evaluate)
app.command("score")(score.score)
app.command("serve")(serve.serve)
app.add_typer(buffer.app, name="buffer")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rlsdk {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """rlsdk: installable plugins for LLM reinforcement-learning rollouts."""


def main() -> None:
    from rlsdk.errors import RlsdkError

    try:
        app()
    except RlsdkError as exc:  # an error rlsdk explains (a plugin failing in strict mode, ...): one line
        typer.echo(f"Error: {exc}", err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
