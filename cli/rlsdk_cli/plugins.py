"""``rlsdk plugins list|show|new``: what is installed, what each plugin provides, and a new plugin package."""

from __future__ import annotations

import inspect
import json
import warnings
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rlsdk import KINDS, RolloutConfig, get_plugin_manager
from rlsdk.errors import PluginError
from rlsdk.config import canonical_keys
from rlsdk.plugins.calls import call_environment
from rlsdk.plugins.manager import RlsdkPluginManager
from rlsdk.plugins.rubric import parse_rubric

app = typer.Typer(help="List and inspect installed plugins.", no_args_is_help=True)


def _manager() -> RlsdkPluginManager:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # failures are listed by the commands themselves
        return get_plugin_manager()


def _kind_option(kind: str | None) -> str | None:
    if kind is not None and kind not in KINDS:
        raise typer.BadParameter(f"unknown kind {kind!r}. Choose one of: {', '.join(KINDS)}")
    return kind


def plugin_rows(pm: RlsdkPluginManager, kind: str | None = None) -> list[dict[str, Any]]:
    """One row per registered plugin: distribution, version, entry point and names by kind."""
    rows: dict[str, dict[str, Any]] = {}
    for info in pm.plugin_infos():
        rows[info.plugin] = {
            "distribution": info.distribution,
            "version": info.version,
            "entry_point": info.plugin,
            "provides": {},
        }
    for k in KINDS if kind is None else (kind,):
        for name, providers in pm.records(k).items():
            for _, info in providers:
                rows[info.plugin]["provides"].setdefault(k, []).append(name)
    for row in rows.values():
        row["provides"] = {k: sorted(v) for k, v in row["provides"].items()}
    listed = [r for r in rows.values() if kind is None or r["provides"]]
    return sorted(
        listed, key=lambda r: (r["distribution"] or "", r["entry_point"])
    )  # entry-point order varies


@app.command("list")
def list_plugins(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    kind: str | None = typer.Option(
        None, "--kind", help=f"Only this kind: {', '.join(KINDS)}.", callback=_kind_option
    ),
) -> None:
    """List installed plugins and the names each provides."""
    pm = _manager()
    rows = plugin_rows(pm, kind)
    failures = [f.__dict__ for f in pm.failures]
    conflicts = [
        {
            "kind": k,
            "name": n,
            "providers": [i.describe() for i in infos],
            "entry_points": [i.plugin for i in infos],
        }
        for k, n, infos in pm.conflicts()
    ]
    if as_json:
        for row in rows:  # each conflict the table prints, on the rows of its providers
            row["conflicts"] = [
                {k: c[k] for k in ("kind", "name", "providers")}
                for c in conflicts
                if row["entry_point"] in c["entry_points"]
            ]
        typer.echo(json.dumps(rows + [{**f, "provides": {}} for f in failures], indent=2))
        return
    console = Console()
    table = Table(title="rlsdk plugins")
    for column in ("distribution", "version", "entry point"):
        table.add_column(column)
    table.add_column("provides", overflow="fold")
    for row in rows:
        provides = "\n".join(f"{k}: {', '.join(v)}" for k, v in row["provides"].items())
        table.add_row(row["distribution"] or "-", row["version"] or "-", row["entry_point"], provides)
    console.print(table)
    for failure in failures:
        console.print(
            "[red]failed to load[/red] "
            + escape(
                f"{failure['entry_point']} from {failure['distribution']} {failure['version']}: {failure['error']}"
            ),
            markup=True,
            highlight=False,
        )
    for conflict in conflicts:
        console.print(
            "[yellow]conflict[/yellow] "
            + escape(
                f"{conflict['kind']} {conflict['name']!r} provided by {' and '.join(conflict['providers'])}"
            ),
            markup=True,
            highlight=False,
        )


@app.command("show")
def show_plugin(
    name: str = typer.Argument(..., help="A registered name or a dotted path."),
    kind: str | None = typer.Option(
        None, "--kind", help="The kind, when the name is used by several.", callback=_kind_option
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show one implementation: kind, distribution, signature and docstring."""
    pm = _manager()
    kinds = [kind] if kind else [k for k in KINDS if name.strip().lower() in pm.records(k)]
    if not kinds:
        installed = {k: pm.names(k) for k in KINDS}
        listing = "; ".join(f"{k}: {', '.join(v) or 'none'}" for k, v in installed.items())
        failed = "".join(
            f"\n{f.entry_point} from {f.distribution} {f.version} failed to load: {f.error}"
            for f in pm.failures
        )
        typer.echo(
            f"Error: no plugin provides {name!r}. Installed: {listing} (plugin may not be installed)"
            + (f"; these plugins failed to load and may provide it:{failed}" if failed else ""),
            err=True,
        )
        raise typer.Exit(2)
    entries: list[dict[str, Any]] = []
    for k in kinds:
        try:
            resolved = pm.resolve(k, name)
        except PluginError as exc:
            typer.echo(f"Error: {exc}", err=True)
            raise typer.Exit(2) from None
        record = resolved.record
        parts = environment_parts(resolved) if k == "environment" else {}
        flags = {
            key: _describe_callable(value) if callable(value) else value
            for key, value in vars(record).items()
            if key not in ("name", "func", "description")
        }
        entries.append(
            {
                "name": record.name,
                "kind": k,
                "distribution": resolved.info.distribution,
                "version": resolved.info.version,
                "entry_point": resolved.info.plugin,
                "callable": _describe_callable(record.func),
                "signature": _signature(record.func),
                "async": resolved.is_async,
                "description": record.description,
                "doc": inspect.getdoc(record.func) or "",
                **flags,
                **({"parts": parts} if parts else {}),
                "options": [
                    {
                        "name": option.name,
                        "type": option.type.__name__,
                        "default": option.default,
                        "help": option.help,
                        **({"choices": list(option.choices)} if option.choices else {}),
                    }
                    for option, info in pm.options(reserved=RolloutConfig.option_names()).values()
                    if info.plugin == resolved.info.plugin
                ],
            }
        )
    if as_json:
        typer.echo(json.dumps(entries if len(entries) > 1 else entries[0], indent=2))
        return
    console = Console()
    for entry in entries:
        console.print(f"[bold]{escape(entry['name'])}[/bold] ({entry['kind']})", highlight=False)
        for key in ("distribution", "version", "entry_point", "callable", "signature", "async"):
            console.print(f"  {key}: {entry[key]}", highlight=False, markup=False)
        for key in set(entry) - {
            "name",
            "kind",
            "distribution",
            "version",
            "entry_point",
            "callable",
            "signature",
            "async",
            "description",
            "doc",
            "options",
            "parts",
        }:
            console.print(f"  {key}: {entry[key]}", highlight=False, markup=False)
        if entry.get("parts"):
            console.print("  parts:", highlight=False, markup=False)
        for part, value in entry.get("parts", {}).items():
            console.print(f"    {part}: {value}", highlight=False, markup=False)
        if entry["options"]:
            console.print(
                f"  options of {entry['distribution'] or entry['entry_point']} (--set NAME=VALUE, or "
                "--name-in-kebab-case):",
                highlight=False,
                markup=False,
            )
        for option in entry["options"]:
            choices = f", one of {', '.join(map(str, option['choices']))}" if "choices" in option else ""
            console.print(
                f"    {option['name']} ({option['type']}, default {option['default']!r}{choices}): "
                f"{option['help']}",
                highlight=False,
                markup=False,
            )
        if entry["doc"]:
            console.print("\n" + entry["doc"] + "\n", highlight=False, markup=False)


ENVIRONMENT_PARTS = {
    "dataset": ("prompt_data",),
    "data keys": ("input_key", "label_key", "metadata_key", "tool_key"),
    "chat": ("apply_chat_template", "apply_chat_template_kwargs"),
    "reward": ("rm_type", "custom_rm_path", "reward_key"),
    "generator": ("custom_generate_function_path", "rollout_function_path"),
    "agent": ("agent_function_path",),
    "eval sets": ("eval_datasets", "eval_prompt_data"),
}
"""How ``plugins show`` groups an environment's settings; the rest are listed as its options."""


def environment_parts(resolved: Any) -> dict[str, Any]:
    """An environment's settings by part (dataset, reward or rubric, generator, ...), the rest as options."""
    try:
        settings = canonical_keys(call_environment(resolved))
    except PluginError as exc:
        return {"error": str(exc)}
    parts: dict[str, Any] = {}
    for part, names in ENVIRONMENT_PARTS.items():
        given = {name: settings.pop(name) for name in names if name in settings}
        if given:
            parts[part] = given[names[0]] if list(given) == [names[0]] else given
    rubric = parse_rubric(str(parts.get("reward", ""))) if isinstance(parts.get("reward"), str) else None
    if rubric:
        parts["reward"] = " + ".join(f"{p.weight:g} x {p.spec}" for p in rubric)
    if settings:
        parts["options"] = settings
    return parts


def _signature(func: Any) -> str:
    try:
        return f"{getattr(func, '__name__', 'func')}{inspect.signature(func)}"
    except (TypeError, ValueError):
        return "?"


def _describe_callable(func: Any) -> str:
    return f"{getattr(func, '__module__', '?')}:{getattr(func, '__qualname__', '?')}"


KIND_HELP = f"A kind to write an example of (repeatable; default reward): {', '.join(KINDS)}."
"""Every kind: ``rlsdk plugins new`` writes an example and its test of each."""


@app.command("new")
def new_plugin(
    name: str = typer.Argument(..., help="The plugin's name, e.g. my-rewards (package my_rewards)."),
    kinds: list[str] | None = typer.Option(None, "--kind", help=KIND_HELP),  # noqa: B008 (typer's default)
    folder: str = typer.Option(".", "--dir", help="Where to create the package's folder."),
) -> None:
    """Create a plugin package: pyproject with the entry point, examples, tests and a README."""
    from .scaffold import scaffold

    try:
        root = scaffold(name, kinds or ["reward"], Path(folder))
    except (ValueError, FileExistsError) as exc:
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(
        f"created {root}\nnext: pip install -e '{root}[test]' && python -m pytest {root} "
        "&& rlsdk plugins list"
    )
