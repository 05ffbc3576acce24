"""The import finder of slime's modules without slime: while the layer is on and no real slime is
importable, ``import slime.X`` gives rlsdk's equivalent of ``X`` (the stand-ins live in
:mod:`rlsdk.slime_compat`), so slime's custom functions run unchanged under ``rlsdk run``, ``rlsdk
eval`` and ``rlsdk score``. A real slime install always wins (it is looked for on every import of
``slime``), and ``RLSDK_SLIME_COMPAT=0`` switches the layer off.

The stand-ins are rlsdk's own objects under slime's names (``slime.utils.types.Sample`` *is*
``rlsdk.Sample``), so what a slime function builds flows through rlsdk's loop as it is.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any

ENV_SWITCH = "RLSDK_SLIME_COMPAT"

MODULES = {
    "slime.utils.types": "rlsdk.slime_compat.utils_types",
    "slime.utils.misc": "rlsdk.slime_compat.utils_misc",
    "slime.utils.http_utils": "rlsdk.slime_compat.http_utils",
    "slime.rollout.base_types": "rlsdk.slime_compat.rollout_base_types",
    "slime.rollout.sglang_rollout": "rlsdk.slime_compat.sglang_rollout",
    "slime.rollout.fully_async_rollout": "rlsdk.slime_compat.fully_async_rollout",
    "slime.rollout.on_policy_distillation": "rlsdk.slime_compat.on_policy_distillation",
    "slime.backends.megatron_utils.cp_utils": "rlsdk.slime_compat.cp_utils",
    "slime.rollout.filter_hub.base_types": "rlsdk.slime_compat.filter_base_types",
    "slime.rollout.filter_hub.dynamic_sampling_filters": "rlsdk_filter_hub.dynamic",
    "slime.rollout.rm_hub": "rlsdk_rm_hub.slime_rm_hub",
    **{
        f"slime.rollout.rm_hub.{name}": f"rlsdk_rm_hub.slime_rm_hub.{name}"
        for name in ("math_utils", "math_dapo_utils", "deepscaler", "f1", "gpqa")
    },
}
"""slime module -> the rlsdk module that stands in for it."""

PACKAGES = (
    "slime",
    "slime.utils",
    "slime.rollout",
    "slime.rollout.filter_hub",
    "slime.backends",
    "slime.backends.megatron_utils",
)
_MARK = "__rlsdk_stand_in__"


def real_slime_importable() -> bool:
    """Whether a real slime is on the path (rlsdk's stand-in never hides one)."""
    loaded = sys.modules.get("slime")
    if loaded is not None:
        return not getattr(loaded, _MARK, False)
    return any(
        finder is not _FINDER and hasattr(finder, "find_spec") and finder.find_spec("slime", None)
        for finder in sys.meta_path
    )


class _StandInLoader(importlib.abc.Loader):
    def __init__(self, target: str | None) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if self.target is None:  # an intermediate package: empty, its children come from MODULES
            module = types.ModuleType(spec.name, f"rlsdk's stand-in for slime's {spec.name} package")
            module.__path__ = []
            setattr(module, _MARK, True)
            return module
        try:
            module = importlib.import_module(self.target)
        except ImportError as exc:
            raise ModuleNotFoundError(
                f"{spec.name} stands in as {self.target}, which cannot be imported ({exc}); install its "
                f"rlsdk plugin package, or slime itself",
                name=spec.name,
            ) from exc
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        if self.target is not None:  # the import system stamped slime's spec on rlsdk's module: undo it
            module.__spec__ = self.own_spec


class SlimeStandInFinder(importlib.abc.MetaPathFinder):
    """Finds ``slime`` and the modules of :data:`MODULES` while no real slime is importable."""

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "slime" and not fullname.startswith("slime."):
            return None
        if real_slime_importable():
            return None
        if fullname in PACKAGES:
            return importlib.machinery.ModuleSpec(fullname, _StandInLoader(None), is_package=True)
        if fullname in MODULES:
            return importlib.machinery.ModuleSpec(fullname, _StandInLoader(MODULES[fullname]))
        raise ModuleNotFoundError(
            f"No module named {fullname!r}: slime is not installed and rlsdk stands in only for "
            f"{', '.join(sorted(MODULES))} (install slime, or set {ENV_SWITCH}=0)",
            name=fullname,
        )


_FINDER = SlimeStandInFinder()


def install() -> bool:
    """Turn the layer on (idempotent); False when ``RLSDK_SLIME_COMPAT=0`` keeps it off."""
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    return True


def uninstall() -> None:
    """Turn the layer off and forget the stand-in modules already imported under slime's names."""
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in [n for n in sys.modules if n == "slime" or n.startswith("slime.")]:
        module = sys.modules[name]
        if getattr(module, _MARK, False) or module.__name__ != name:  # a stand-in, never slime's own
            del sys.modules[name]


def installed() -> bool:
    return _FINDER in sys.meta_path
