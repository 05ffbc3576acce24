"""The docs' generated parts, from the code they describe, written into the Markdown files themselves so that
they read the same on the repository as on the site: ``python scripts/docs_generate.py`` rewrites them, and
``tests/test_readme_plugin_docs.py`` fails while a page is not current.

Each part sits between ``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->``:

- ``kinds table`` (docs/plugins.md): every kind's hook, record, fields, run option and when it is called;
- ``kinds signatures`` (docs/plugin-kinds.md): every kind's call, what it returns, its run option and its
  ``rlsdk.testing`` check;
- ``kinds examples`` (docs/plugin-kinds.md): a section for each kind the page has no written section for:
  its record's docstring (what it is called with, the shapes it gets) and the complete example there (the one
  ``rlsdk plugins new --kind`` writes).

All of it comes from the kinds' declarations (:mod:`rlsdk.plugins.kinds`): a new kind appears without an edit
to the docs, once this script has run."""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import textwrap
from pathlib import Path

from rlsdk import testing
from rlsdk.plugins.kinds import RECORD_TYPES
from rlsdk.plugins.records import Option, PluginRecord

DOCS = Path(__file__).resolve().parents[1] / "docs"
BEGIN, END = "<!-- generated: {} -->", "<!-- end generated: {} -->"


def kinds_table() -> str:
    """One row per kind: its hook, record, fields, the run option naming it and when it is called."""
    rows = ["| hook | record | fields | run option | called per |", "| --- | --- | --- | --- | --- |"]
    for record in RECORD_TYPES.values():
        fields = ", ".join(f"`{f.name}`" for f in dataclasses.fields(record))
        option = ", ".join(f"`{o.name}`" for o in record.options) or "-"
        rows.append(f"| `{record.hook_name()}` | `{record.__name__}` | {fields} | {option} | {record.scope} |")
    options = ", ".join(f"`{f.name}`" for f in dataclasses.fields(Option))
    rows.append(f"| `rlsdk_options` | `Option` | {options} | - | - |")
    return "\n".join(rows)


def markdown(text: str) -> str:
    """A docstring's reStructuredText as Markdown: ````x```` and ``:role:`x``` become ```x```."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def call_protocols(record: type[PluginRecord]) -> list[type]:
    """The typed call ``Protocol`` (or Protocols: a reward's per-sample and group calls) of ``record.func``;
    none for a kind whose call is any keyword arguments (a tool's)."""
    module = sys.modules[record.__module__]
    annotation = record.__dict__.get("__annotations__", {}).get("func")
    return [getattr(module, name.strip()) for name in str(annotation).split("|")] if annotation else []


def call_text(kind: str, protocol: type) -> str:
    """``kind(args, sample, /)`` from the Protocol's ``__call__``: the parameters' names, kinds and defaults."""
    parameters = list(inspect.signature(protocol.__call__).parameters.values())[1:]  # without self
    shown = inspect.Signature([p.replace(annotation=inspect.Parameter.empty) for p in parameters])
    return f"{kind}{shown}"


def opening(record: type[PluginRecord]) -> str:
    """The signature ``record``'s docstring opens with (its first ````...(...)...````)."""
    found = re.search(r"``([^`]*\([^`]*)``", record.__doc__ or "")
    return " ".join(found.group(1).split()) if found else ""


def check_name(kind: str) -> str:
    name = f"check_{kind}"
    return f"`{name}`" if hasattr(testing, name) else "`check_plugin`"


def cell(text: str) -> str:
    """``text`` as code in a table cell (its ``|`` escaped, which would end the cell)."""
    return f"`{text}`".replace("|", "\\|")


def kinds_signatures() -> str:
    """One row per kind: its call as its docstring opens (with what it returns), the arguments a run passes
    (from its typed Protocol, which mypy checks a plugin against), its run option and its check."""
    rows = [
        "| kind | call | the run passes (typed `Protocol`) | run option | `rlsdk.testing` check | called per |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for kind, record in RECORD_TYPES.items():
        passed = "<br>".join(cell(call_text(kind, p)) for p in call_protocols(record)) or "keyword arguments"
        option = ", ".join(f"`--{o.name.replace('_', '-')}`" for o in record.options) or "-"
        rows.append(
            f"| `{kind}` | {cell(opening(record))} | {passed} | {option} | {check_name(kind)} | {record.scope} |"
        )
    return "\n".join(rows)


def example_code(record: type[PluginRecord]) -> str:
    """The complete example module in ``record``'s docstring."""
    return textwrap.dedent((record.__doc__ or "").split(".. code-block:: python", 1)[1]).strip()


def kinds_examples(written: set[str]) -> str:
    """A section per kind not in ``written``: what it is and its example, from its record's docstring."""
    sections = []
    for kind, record in RECORD_TYPES.items():
        if kind in written:
            continue
        text = inspect.cleandoc(record.__doc__ or "").split("**Example:**", 1)[0].strip()
        option = ", ".join(f"`--{o.name.replace('_', '-')} NAME`" for o in record.options)
        selected = f"Selected with {option}. " if option else ""
        sections.append(
            f"## `{kind}`\n\n{markdown(text)}\n\n{selected}Checked by {check_name(kind)}.\n\n"
            f"```python\n{example_code(record)}\n```"
        )
    return "\n\n".join(sections)


def written_sections(text: str) -> set[str]:
    """The kinds a page has a written section for (``## `kind```, outside its generated parts)."""
    outside = re.sub(r"<!-- generated: (.*?) -->.*?<!-- end generated: \1 -->", "", text, flags=re.S)
    return set(re.findall(r"^## `(\w+)`", outside, flags=re.M))


def fill(text: str, name: str, content: str) -> str:
    """``text`` with its generated part ``name`` holding ``content``; a page without the part is an error."""
    begin, end = BEGIN.format(name), END.format(name)
    if begin not in text or end not in text:
        raise ValueError(f"no {begin} ... {end} in the page")
    head, rest = text.split(begin, 1)
    return f"{head}{begin}\n{content}\n{end}{rest.split(end, 1)[1]}"


def pages() -> dict[Path, str]:
    """Every page with a generated part, as it should read."""
    plugins, kinds = DOCS / "plugins.md", DOCS / "plugin-kinds.md"
    kinds_text = kinds.read_text()
    kinds_text = fill(kinds_text, "kinds signatures", kinds_signatures())
    kinds_text = fill(kinds_text, "kinds examples", kinds_examples(written_sections(kinds_text)))
    return {plugins: fill(plugins.read_text(), "kinds table", kinds_table()), kinds: kinds_text}


def main() -> None:
    for path, text in pages().items():
        if path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
