"""Forwarding names for modules that moved: ``import rlsdk.generate`` keeps working for one minor version.

Each old module path in :data:`MOVED` imports as a stand-in module whose attributes are the new module's;
reading one warns with a ``DeprecationWarning`` that names the replacement: the public name in ``rlsdk``
where there is one, else the module the name now lives in (internal: ask for it to be made public).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

REMOVED_IN = "0.3.0"
MOVED = {
    # 0.1 layout moves (rlsdk.<module> into the rollout, engines, plugins and aio packages)
    "rlsdk.generate": "rlsdk.rollout.generate",
    "rlsdk.tools": "rlsdk.rollout.tools",
    "rlsdk.rewarding": "rlsdk.rollout.rewarding",
    "rlsdk.ledger": "rlsdk.rollout.ledger",
    "rlsdk.evaluation": "rlsdk.rollout.evaluation",
    "rlsdk.buffer_service": "rlsdk.rollout.buffer_service",
    "rlsdk.job": "rlsdk.run.job",
    "rlsdk.engine": "rlsdk.engines.engine",
    "rlsdk.protocol": "rlsdk.engines.protocol",
    "rlsdk.sglang_client": "rlsdk.engines.sglang_client",
    "rlsdk.serve": "rlsdk.run.engine_server",
    "rlsdk.service_guard": "rlsdk.engines.service_guard",
    "rlsdk.engine_health": "rlsdk.run.engine_health",
    "rlsdk.engine_stats": "rlsdk.sample_stats",
    "rlsdk.launch": "rlsdk.engines.launch",
    "rlsdk.launch.sglang": "rlsdk.engines.launch.sglang",
    "rlsdk.launch.process_group": "rlsdk.engines.launch.process_group",
    "rlsdk.hookspecs": "rlsdk.plugins.hookspecs",
    "rlsdk.records": "rlsdk.plugins.kinds",  # the records, each kind's declaration, and what they share
    "rlsdk.manager": "rlsdk.plugins.manager",
    "rlsdk.loading": "rlsdk.plugins.loading",
    "rlsdk.plugin_calls": "rlsdk.plugins.calls",
    "rlsdk.defaults": "rlsdk.rollout.plugin",
    "rlsdk.backoff": "rlsdk.aio.backoff",
    "rlsdk.blocking": "rlsdk.aio.blocking",
    "rlsdk.concurrency": "rlsdk.aio.concurrency",
    "rlsdk.deadlines": "rlsdk.aio.deadlines",
    "rlsdk.task_pools": "rlsdk.aio.task_pools",
    # 0.2: the composition layer (rlsdk.run) takes the job and the engine server
    "rlsdk.rollout.job": "rlsdk.run.job",
    "rlsdk.engines.server": "rlsdk.run.engine_server",
    "rlsdk.plugins.defaults": "rlsdk.rollout.plugin",
    "rlsdk.engines.stats": "rlsdk.sample_stats",
    "rlsdk.engines.health": "rlsdk.run.engine_health",
    "rlsdk.training.options": "rlsdk.training_options",
    "rlsdk.slime_compat.real_slime": "rlsdk.plugins.real_slime",
}
"""Old module path -> the module its names live in now."""

PUBLIC_RENAMES = {"generate": "single_turn"}
"""A moved module's name -> its public name in ``rlsdk`` where the two differ."""


def replacement(old_module: str, name: str) -> str:
    """What a warning tells the user to import instead of ``old_module.name``."""
    public = PUBLIC_RENAMES.get(name, name)
    if public in sys.modules["rlsdk"].__all__:  # rlsdk itself is imported first, always
        return f"rlsdk.{public}"
    audience = sys.modules["rlsdk"].MOVED.get(public)  # an engine's or a trainer's name
    if audience is not None:
        return f"{audience}.{public}"
    return f"{MOVED[old_module]}.{name} (internal; ask for a public name if a plugin needs it)"


class _MovedModule(types.ModuleType):
    """Stands in for a moved module: attributes come from the new one, each read warned about once per
    place that reads it (Python's warning filters)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        target = importlib.import_module(MOVED[self.__name__])
        value = getattr(target, name)
        warnings.warn(
            f"{self.__name__}.{name} is deprecated and will be removed in rlsdk {REMOVED_IN}: "
            f"use {replacement(self.__name__, name)}",
            DeprecationWarning,
            stacklevel=2,
        )
        return value

    def __dir__(self) -> list[str]:
        return dir(importlib.import_module(MOVED[self.__name__]))


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old module paths of :data:`MOVED` (after the real finders missed them)."""

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        is_package = any(other.startswith(fullname + ".") for other in MOVED)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=is_package)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _MovedModule(spec.name)
        if spec.submodule_search_locations is not None:
            module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def forward(package: str, names: dict[str, str], removed_in: str = REMOVED_IN) -> Any:
    """A module ``__getattr__`` for ``package`` that forwards the names it no longer has (name -> where it
    is now, ``"module"`` or ``"module:new_name"``), warning as :class:`_MovedModule` does."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, new_name = names[name].partition(":")
        new_name = new_name or name
        value = getattr(importlib.import_module(module), new_name)
        warnings.warn(
            f"{package}.{name} is deprecated and will be removed in rlsdk {removed_in}: use {module}.{new_name}",
            DeprecationWarning,
            stacklevel=2,
        )
        return value

    return __getattr__


def install() -> None:
    """Add the finder once (after the path finders, so a real module of the name always wins)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
