"""The public API as text: every name ``rlsdk`` and ``rlsdk.testing`` export, with its signature (a class's
public methods and fields too), and the deprecated names that still forward.

    python scripts/api_snapshot.py            # print it
    python scripts/api_snapshot.py --write    # update api/rlsdk.txt (then add a CHANGELOG line)

``tests/test_public_api.py`` compares it with the committed ``api/rlsdk.txt``, so every change to the public
API is a deliberate edit to that file, reviewed with a CHANGELOG line under Added, Deprecated or Breaking.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

SNAPSHOT = Path(__file__).resolve().parent.parent / "api" / "rlsdk.txt"
MODULES = ("rlsdk", "rlsdk.testing")


def _signature(obj: Any) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _class_lines(prefix: str, cls: type) -> list[str]:
    bases = ", ".join(b.__name__ for b in cls.__bases__ if b is not object)
    lines = [f"class {prefix}({bases})" if bases else f"class {prefix}"]
    if issubclass(cls, enum.Enum):
        return lines + [f"  {prefix}.{m.name} = {m.value!r}" for m in cls]
    if dataclasses.is_dataclass(cls):
        lines += [f"  field {f.name}: {f.type}" for f in dataclasses.fields(cls) if not f.name.startswith("_")]
    for name, member in sorted(vars(cls).items()):
        if name.startswith("_") and name not in ("__init__", "__call__"):
            continue
        if isinstance(member, property):
            lines.append(f"  property {name}")
        elif isinstance(member, (staticmethod, classmethod)):
            lines.append(f"  {type(member).__name__} {name}{_signature(member.__func__)}")
        elif inspect.isfunction(member):
            kind = "async def" if inspect.iscoroutinefunction(member) else "def"
            lines.append(f"  {kind} {name}{_signature(member)}")
        elif inspect.isclass(member):
            lines += ["  " + line for line in _class_lines(f"{prefix}.{name}", member)]
    return lines


def describe(module_name: str, name: str) -> list[str]:
    obj = getattr(importlib.import_module(module_name), name)
    qualified = f"{module_name}.{name}"
    if inspect.isclass(obj):
        return _class_lines(qualified, obj)
    if callable(obj):
        kind = "async def" if inspect.iscoroutinefunction(obj) else "def"
        return [f"{kind} {qualified}{_signature(obj)}"]
    return [f"{qualified}: {type(obj).__name__} = {obj!r}"]


def snapshot() -> str:
    from rlsdk import _moved

    lines = ["# The public API of rlsdk (scripts/api_snapshot.py). Edit only with a CHANGELOG line.", ""]
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        lines.append(f"## {module_name}")
        for name in sorted(module.__all__):
            lines += describe(module_name, name)
        lines.append("")
    lines.append(f"## deprecated module paths (forward with a DeprecationWarning; removed in {_moved.REMOVED_IN})")
    lines += [f"{old} -> {new}" for old, new in sorted(_moved.MOVED.items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    text = snapshot()
    if "--write" in sys.argv:
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(text)
        print(f"wrote {SNAPSHOT}")
    else:
        print(text, end="")
