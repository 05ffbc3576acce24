"""The ``sglang_<name>`` and ``router_<name>`` settings rlsdk passes to a launched SGLang server or router,
checked against the arguments the installed SGLang and sglang-router take (``ServerArgs``, ``RouterArgs``).
Where they are not installed in this Python (SGLang needs CUDA), a setting is passed on with a warning: the
launched program's own parser is then the check."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import warnings
from collections.abc import Collection

CLIENT_OPTIONS = frozenset(
    {
        "sglang_url",
        "sglang_launch",
        "sglang_python",
        "sglang_retries",
        "sglang_backoff",
        "sglang_server_concurrency",
        "sglang_router_ip",
        "sglang_router_port",
        "sglang_startup_timeout",
        "sglang_model_routers",
    }
)
"""``sglang_*`` options that configure rlsdk's side, never passed to a server."""

SOURCES = {
    "sglang_": ("sglang", "ServerArgs", ["sglang.srt.server_args"]),
    "router_": ("sglang_router", "RouterArgs", ["sglang_router.router_args", "sglang_router.launch_router"]),
}
"""Prefix -> the program, its arguments' dataclass and the modules it has lived in."""


@functools.cache
def installed_arguments(prefix: str) -> frozenset[str] | None:
    """The argument names of the program behind ``prefix``, or None when it is not installed here."""
    _, class_name, modules = SOURCES[prefix]
    for module_name in modules:
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except Exception:  # noqa: BLE001, S112 - absent, or not importable here (no CUDA): try the next
            continue
        return frozenset(f.name for f in dataclasses.fields(cls))
    return None


def check_passthrough(key: str, own: Collection[str]) -> None:
    """Raise ValueError for a ``sglang_``/``router_`` ``key`` that names no argument: one close to rlsdk's
    ``own`` options of the prefix (a typo of ``sglang_server_concurrency``), or unknown to the installed
    program (with the closest of its arguments). Warn when the program is not installed here."""
    prefix = "sglang_" if key.startswith("sglang_") else "router_"
    close = difflib.get_close_matches(key, [o for o in own if o.startswith(prefix)], n=1, cutoff=0.85)
    if close:
        raise ValueError(f"unknown option {key!r} (did you mean {close[0]!r}?)")
    known = installed_arguments(prefix)
    name = key.removeprefix(prefix)
    if known is None:
        program = SOURCES[prefix][0]
        warnings.warn(
            f"{key}: passed to the launched {program} as --{name.replace('_', '-')} unchecked ({program} is not "
            "installed in this Python to check it against)",
            stacklevel=3,
        )
        return
    if name not in known:
        guess = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {prefix + guess[0]!r}?)" if guess else ""
        raise ValueError(f"unknown option {key!r}: {SOURCES[prefix][1]} has no argument {name!r}{hint}")
