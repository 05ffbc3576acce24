"""The plugin-author documentation stays in step with the code: docs/plugins.md shows the table of every hook
with its record and exactly the record's fields, docs/plugin-kinds.md every kind's call and example (both
generated from the kinds' declarations into the pages, and current), the README and the docs name no hook that does not exist, and every python example of the README and
the docs site runs."""

from __future__ import annotations

import dataclasses
import re
import sys
import types
from pathlib import Path

import pytest

from rlsdk.plugins import hookspecs
from rlsdk.plugins.kinds import RECORD_TYPES, hook_name
from rlsdk.plugins.records import Option

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
import docs_generate  # noqa: E402

README = Path(__file__).parents[1] / "README.md"
PLUGINS_PAGE = README.parent / "docs" / "plugins.md"


def plugin_section() -> str:
    """docs/plugins.md, its generated parts as committed (checked current below)."""
    return PLUGINS_PAGE.read_text()


def test_the_generated_parts_of_the_pages_are_current():
    """The kinds' tables and examples are generated into the pages (readable on the repository without
    building the site): ``python scripts/docs_generate.py`` after a kind changes."""
    stale = [path.name for path, text in docs_generate.pages().items() if path.read_text() != text]
    assert not stale, f"{stale}: run python scripts/docs_generate.py"


def test_every_kind_has_an_example_and_a_signature_row_on_the_kinds_page():
    text = (README.parent / "docs" / "plugin-kinds.md").read_text()
    assert set(re.findall(r"^## `(\w+)`", text, flags=re.M)) == set(RECORD_TYPES)
    assert set(re.findall(r"^\| `(\w+)` \|", text, flags=re.M)) == set(RECORD_TYPES)


def documented_records() -> dict[str, tuple[str, list[str]]]:
    """hook -> (record, fields) from the section's table."""
    rows = re.findall(r"^\| `(rlsdk_\w+)` \| `(\w+)` \| ([^|]+) \|", plugin_section(), flags=re.M)
    return {hook: (record, re.findall(r"`(\w+)`", fields)) for hook, record, fields in rows}


def test_every_hook_is_documented_with_its_record_and_fields():
    expected = {hook_name(kind): (cls.__name__, [f.name for f in dataclasses.fields(cls)])
                for kind, cls in RECORD_TYPES.items()}
    expected["rlsdk_options"] = ("Option", [f.name for f in dataclasses.fields(Option)])
    assert documented_records() == expected


def test_the_hookspecs_are_exactly_the_documented_hooks():
    specs = {name for name in dir(hookspecs) if name.startswith("rlsdk_")
             and hasattr(getattr(hookspecs, name), "rlsdk_spec")}
    assert specs == set(documented_records())
    for page in (README, *sorted((README.parent / "docs").glob("*.md"))):
        named = set(re.findall(r"\brlsdk_[a-z_]+s\b", page.read_text())) - {"rlsdk_cli"}
        assert named <= specs, f"{page.name} names hooks that do not exist: {sorted(named - specs)}"


# ----- the code examples of the README and the documentation site -------------------------------------------

DOCS = sorted((README.parent / "docs").glob("*.md"))
SKIP = re.compile(r"<!-- not run: [^>]+ -->\s*$")
"""A comment on the line before a block that cannot run on its own, saying why (it imports the package it
documents, say)."""


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """The ```python blocks of a Markdown file with their line numbers, except those marked not run."""
    text = path.read_text()
    blocks = []
    for match in re.finditer(r"^```python\n(.*?)^```$", text, flags=re.M | re.S):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if not SKIP.search(before):
            blocks.append((text.count("\n", 0, match.start()) + 2, match.group(1)))
    return blocks


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_the_python_examples_run_and_their_plugins_resolve(path):
    """Each page's python blocks run in order in one module (a later block may use an earlier one's names);
    the hooks they define are registered on a fresh manager, and every record they yield resolves, its
    callable's signature checked."""
    from rlsdk import get_plugin_manager
    from rlsdk.plugins.records import PluginRecord

    module = types.ModuleType(f"docs_example_{path.stem.replace('-', '_')}")
    for line, code in python_blocks(path):
        try:
            exec(compile(code, f"{path.name}:{line}", "exec"), module.__dict__)  # noqa: S102 (our own docs)
        except Exception as exc:
            raise AssertionError(f"{path.name}, the python block at line {line}: {exc!r}") from exc
    hooks = [name for name in vars(module) if name.startswith("rlsdk_") and callable(vars(module)[name])]
    if not hooks:
        return
    pm = get_plugin_manager(load_entrypoints=False, plugins=[module])
    for hook in hooks:
        for record in getattr(module, hook)():
            if isinstance(record, PluginRecord):
                assert pm.resolve(record.kind, record.name).func is record.func, (path.name, record.name)


def test_the_site_holds_the_pages_it_lists():
    """mkdocs.yml's nav names every page under docs/ (a page left out of the site is a page nobody finds)."""
    nav = set(re.findall(r":\s*([\w-]+\.md)\s*$", (README.parent / "mkdocs.yml").read_text(), flags=re.M))
    assert nav == {p.name for p in DOCS}
