"""The typer app behind the ``rlsdk`` console script. Each subcommand lives in its own module, imported only
when that subcommand runs (or ``--help`` lists it): ``rlsdk plugins list`` loads neither the run's modules nor
the servers' (aiohttp)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any

import typer
from typer.core import TyperGroup

from rlsdk import __version__

SGLANG_PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}
"""``rlsdk run`` takes any ``--sglang-*`` flag for the SGLang servers it launches and any ``--router-*`` for
their router, as slime does (:func:`.run.sglang_passthrough_options`)."""
SUBCOMMANDS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "plugins": ("plugins", "app", {}),
    "run": ("run", "run", {"context_settings": SGLANG_PASSTHROUGH}),
    "eval": ("run", "evaluate", {}),
    "score": ("score", "score", {}),
    "serve": ("serve", "serve", {}),
    "export": ("export", "export", {}),
    "view": ("view", "view", {}),
    "buffer": ("buffer", "app", {}),
    "tinker": ("tinker", "app", {}),
}
"""Subcommand -> (its module in ``rlsdk_cli``, the typer app or command function there, the command's
settings)."""


def load_subcommand(name: str) -> Any:
    """The click command of subcommand ``name``, its module imported now: made as the root app would make it
    (a typer app stays a group, ``rlsdk buffer serve``; no completion options)."""
    module, attribute, settings = SUBCOMMANDS[name]
    target = getattr(importlib.import_module(f"{__package__}.{module}"), attribute)
    parent = typer.Typer(add_completion=False)
    if isinstance(target, typer.Typer):
        parent.add_typer(target, name=name)
    else:
        parent.command(name, **settings)(target)
    return typer.main.get_group(parent).commands[name]


class LazyCommands(Mapping[str, Any]):
    """The subcommands by name, each loaded on first access (:func:`load_subcommand`)."""

    def __init__(self) -> None:
        self.loaded: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in SUBCOMMANDS:
            raise KeyError(name)
        if name not in self.loaded:
            self.loaded[name] = load_subcommand(name)
        return self.loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(SUBCOMMANDS)

    def __len__(self) -> int:
        return len(SUBCOMMANDS)


class LazyGroup(TyperGroup):
    """The root group, its subcommands :class:`LazyCommands`."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = LazyCommands()  # type: ignore[assignment]


app = typer.Typer(
    name="rlsdk",
    cls=LazyGroup,
    help="rlsdk: installable plugins for LLM reinforcement-learning rollouts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


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
