"""The public API's promise, checked with griffe: what ``rlsdk`` and ``rlsdk.testing`` export now against the
released baseline ``api/rlsdk.json`` (griffe's serialization of each public object, docstrings left out).

    python scripts/api_check.py                  # check (CI): exit 1 with what breaks the promise
    python scripts/api_check.py --write [REF]    # at a release: the baseline from REF (a git ref; default
                                                 # the working tree)

- An addition (a new public name) is allowed with a CHANGELOG line under ``## Unreleased`` naming it.
- A break (a public name removed, or changed so that old code stops working: griffe's breaking changes, a
  parameter removed or moved, a field gone, a type changed) fails, unless the CHANGELOG's ``## Unreleased``
  names it under ``### Deprecated`` (it keeps working and warns) or ``### Breaking`` (a deliberate break,
  for a major or 0.x minor release).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import griffe

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "api" / "rlsdk.json"
CHANGELOG = ROOT / "CHANGELOG.md"
MODULES = ("rlsdk", "rlsdk.testing", "rlsdk.engine_api", "rlsdk.trainer_api")


def _without_docstrings(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _without_docstrings(v) for k, v in obj.items() if k != "docstring"}
    if isinstance(obj, list):
        return [_without_docstrings(v) for v in obj]
    return obj


def public_api(ref: str | None = None) -> dict[str, dict[str, Any]]:
    """Public path (``rlsdk.Reward``) -> the object's griffe serialization, for the working tree or ``ref``."""
    options: dict[str, Any] = {"resolve_aliases": True, "resolve_external": False}
    if ref:  # the search path is the repository's, in a worktree of ``ref``
        package = griffe.load_git("rlsdk", ref=ref, repo=ROOT, search_paths=["core"], **options)
    else:
        package = griffe.load("rlsdk", search_paths=[ROOT / "core"], **options)
    api = {}
    for module_path in MODULES:
        module = package if module_path == "rlsdk" else package[module_path.removeprefix("rlsdk.")]
        for name in module.exports or []:
            target = module[name]
            target = target.final_target if target.is_alias else target
            encoded = json.dumps(target, cls=griffe.JSONEncoder, full=False)
            api[f"{module_path}.{name}"] = _without_docstrings(json.loads(encoded))
    return api


def unreleased_names(changelog: str) -> dict[str, set[str]]:
    """Section (``Added``, ``Deprecated``, ``Breaking``, ...) -> the names in backticks its lines mention, for
    the ``## Unreleased`` part of the CHANGELOG (``rlsdk.X``, ``X`` and ``X.y`` each count for ``X``)."""
    unreleased = changelog.split("## Unreleased", 1)[1].split("\n## ", 1)[0]
    sections: dict[str, set[str]] = {}
    for title, body in re.findall(r"^### (\w+)[^\n]*\n(.*?)(?=^### |\Z)", unreleased, flags=re.M | re.S):
        names = sections.setdefault(title, set())
        for quoted in re.findall(r"`([^`]+)`", body):
            for word in re.findall(r"[A-Za-z_][\w.]*", quoted):
                names.add(word.removeprefix("rlsdk.testing.").removeprefix("rlsdk.").split(".")[0])
    return sections


def _module(name: str, data: dict[str, Any]) -> griffe.Module:
    """The serialized object ``data`` as the one member ``name`` of a module: griffe compares a module's
    members (a function's parameters, a class's members, recursively), not a lone object."""
    module = griffe.Module("api")
    module.set_member(name, json.loads(json.dumps(data), object_hook=griffe.json_decoder))
    return module


def _explain(breakage: Any) -> str:
    """A griffe breaking change in one line (its own explanation needs the object's module, which a decoded
    baseline object lacks)."""
    old, new = (str(getattr(v, "name", v))[:60] for v in (breakage.old_value, breakage.new_value))
    return f"{breakage.kind.value}: {breakage.obj.name} ({old} -> {new})"


def problems(baseline: dict[str, Any], current: dict[str, Any], changelog: str) -> list[str]:
    """What breaks the promise: additions without a CHANGELOG line, breaks without a deprecation or a
    deliberate Breaking line."""
    sections = unreleased_names(changelog)
    accepted = sections.get("Deprecated", set()) | sections.get("Breaking", set())
    mentioned = set().union(*sections.values()) if sections else set()
    found = []
    for path in sorted(set(current) - set(baseline)):
        if path.rsplit(".", 1)[1] not in mentioned:
            found.append(f"added {path}: name it in a CHANGELOG line under ## Unreleased (### Added)")
    for path in sorted(set(baseline) - set(current)):
        if path.rsplit(".", 1)[1] not in accepted:
            found.append(f"removed {path}: keep it forwarding with a DeprecationWarning (### Deprecated)")
    for path in sorted(set(baseline) & set(current)):
        if baseline[path] == current[path] or path.rsplit(".", 1)[1] in accepted:
            continue
        name = path.rsplit(".", 1)[1]
        breaks = list(
            griffe.find_breaking_changes(_module(name, baseline[path]), _module(name, current[path]))
        )
        for breakage in breaks:
            found.append(
                f"changed {path}: {_explain(breakage)} (### Deprecated with a path, or ### Breaking)"
            )
    return found


def main(argv: list[str]) -> int:
    if argv[:1] == ["--write"]:
        ref = argv[1] if len(argv) > 1 else None
        BASELINE.write_text(json.dumps(public_api(ref), indent=1, sort_keys=True) + "\n")
        print(f"wrote {BASELINE} ({ref or 'the working tree'})")
        return 0
    found = problems(json.loads(BASELINE.read_text()), public_api(), CHANGELOG.read_text())
    for line in found:
        print(line)
    print(f"public API: {len(found)} problem(s) against {BASELINE.relative_to(ROOT)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
