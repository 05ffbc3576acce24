"""The typer app behind the ``rlsdk`` console script. Subcommands live in their own modules."""

from __future__ import annotations

import typer

from rlsdk import __version__

from . import buffer, export, plugins, run, score, serve, tinker, view

app = typer.Typer(
    name="rlsdk",
    help="rlsdk: installable plugins for LLM reinforcement-learning rollouts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(plugins.app, name="plugins")
app.command("run", context_settings=run.SGLANG_PASSTHROUGH)(run.run)
app.command("eval")(run.evaluate)
app.command("score")(score.score)
app.command("serve")(serve.serve)
app.command("export")(export.export)
app.command("view")(view.view)
app.add_typer(buffer.app, name="buffer")
app.add_typer(tinker.app, name="tinker")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rlsdk {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """rlsdk: installable plugins for LLM reinforcement-learning rollouts."""


SLIME_MULTI_VALUE_FLAGS = ("--eval-prompt-data", "--rollout-stop", "--rollout-stop-token-ids")
"""slime's options that take several values after one flag (``--eval-prompt-data aime a.jsonl gsm g.jsonl``);
the CLI takes them repeated, so slime's form is spread out before parsing."""


def spread_multi_value_flags(argv: list[str]) -> list[str]:
    """``--flag a b c`` -> ``--flag a --flag b --flag c`` for :data:`SLIME_MULTI_VALUE_FLAGS`; the values run
    until the next token that starts with ``--`` (a flag left without a value stays, for the parser's error)."""
    out: list[str] = []
    flag: str | None = None
    pending = False  # a multi-value flag still waiting for its first value
    for token in argv:
        if token.startswith("--"):
            if pending and flag is not None:
                out.append(flag)
            flag = token if token in SLIME_MULTI_VALUE_FLAGS else None
            pending = flag is not None
            if flag is None:
                out.append(token)
        elif flag is not None:
            out += [flag, token]
            pending = False
        else:
            out.append(token)
    if pending and flag is not None:
        out.append(flag)
    return out


OPTIONAL_VALUES = {"--ray": "local"}
"""Options whose value may be left out: ``rlsdk run --ray`` means ``--ray local``."""


def fill_optional_values(argv: list[str]) -> list[str]:
    """Give each option of :data:`OPTIONAL_VALUES` that has no value (last, or followed by an option) its
    default value."""
    out: list[str] = []
    for i, token in enumerate(argv):
        out.append(token)
        if token in OPTIONAL_VALUES and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            out.append(OPTIONAL_VALUES[token])
    return out


def one_line_warning(message: Warning | str, category: type[Warning], *args: object, **kwargs: object) -> str:
    """A warning as the command prints it: its kind and message, without the source line that raised it."""
    return f"{category.__name__}: {message}\n"


def main() -> None:
    import sys
    import warnings

    from rlsdk.errors import RlsdkError

    warnings.formatwarning = one_line_warning
    try:
        app(args=fill_optional_values(spread_multi_value_flags(sys.argv[1:])))
    except RlsdkError as exc:  # an error rlsdk explains (a plugin failing in strict mode, ...): one line
        typer.echo(f"Error: {exc}", err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
