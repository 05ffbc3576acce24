"""The README's plugin-author documentation stays in step with the hookspecs: every hook is listed with its
record and exactly the record's fields, and the README names no hook that does not exist."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from rlsdk.plugins import hookspecs
from rlsdk.plugins.records import RECORD_TYPES, Option, hook_name

README = Path(__file__).parents[1] / "README.md"


def plugin_section() -> str:
    text = README.read_text()
    start = text.index("## Writing a plugin")
    end = text.find("\n## ", start + 1)
    return text[start:] if end == -1 else text[start:end]


def documented_records() -> dict[str, tuple[str, list[str]]]:
    """hook -> (record, fields) from the section's table."""
    rows = re.findall(r"^\| `(rlsdk_\w+)` \| `(\w+)` \| (.+) \|$", plugin_section(), flags=re.M)
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
    named = set(re.findall(r"\brlsdk_[a-z_]+s\b", README.read_text())) - {"rlsdk_cli"}
    assert named <= specs, f"the README names hooks that do not exist: {sorted(named - specs)}"
