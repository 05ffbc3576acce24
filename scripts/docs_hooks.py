"""mkdocs hooks (mkdocs.yml ``hooks:``): the pages' generated parts, from the code they describe.

``<!-- kinds table -->`` on a page becomes the table of every kind of plugin, from the kinds' declarations
(:mod:`rlsdk.plugins.kinds`): a new kind appears there without an edit to the docs."""

from __future__ import annotations

import dataclasses
from typing import Any

from rlsdk.plugins.kinds import RECORD_TYPES
from rlsdk.plugins.records import Option

KINDS_MARKER = "<!-- kinds table -->"


def kinds_table() -> str:
    """One row per kind: its hook, record, fields, the run option naming it and when it is called."""
    rows = ["| hook | record | fields | run option | called per |", "| --- | --- | --- | --- | --- |"]
    for record in RECORD_TYPES.values():
        fields = ", ".join(f"`{f.name}`" for f in dataclasses.fields(record))
        option = ", ".join(f"`{o.name}`" for o in record.options) or "-"
        rows.append(
            f"| `{record.hook_name()}` | `{record.__name__}` | {fields} | {option} | {record.scope} |"
        )
    options = ", ".join(f"`{f.name}`" for f in dataclasses.fields(Option))
    rows.append(f"| `rlsdk_options` | `Option` | {options} | - | - |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return markdown.replace(KINDS_MARKER, kinds_table())
