"""rlsdk's plugins inside slime, by name: each submodule is one kind of plugin, and any installed plugin of
that kind is an attribute of it, adapted to slime's calling conventions. For example::

    --custom-rm-path rlsdk.slime.reward.deepscaler
    --dynamic-sampling-filter-path rlsdk.slime.dynamic_filter.check_reward_nonzero_std
    --custom-generate-function-path rlsdk.slime.custom_generate.multi_turn
    --rollout-function-path rlsdk.slime.generate_rollout.sglang
    --buffer-filter-path rlsdk.slime.buffer_filter.drop_stale

slime loads these with ``importlib`` and ``getattr``; the adapters (:mod:`rlsdk.slime.adapters`) make
rewards awaitable, return slime's own ``DynamicFilterOutput``, ``RolloutFnTrainOutput`` and ``Sample``
when slime is importable, call slime's data source as ``get_samples(n)``, accept ``rollout_id=None``, and
give rlsdk's plugins rlsdk's defaults for the options slime's ``args`` does not have.
"""

from __future__ import annotations

import sys
import types

from ..plugins.kinds import RECORD_TYPES
from .adapters import kind_module_hooks, view

__all__ = ["view"]
"""``view(args)``: slime's ``args`` as rlsdk's plugins see them (rlsdk's defaults for the options slime has
not), the object the adapters hand them, and the one the runtime built for slime's call is bound to."""


def kind_module(kind: str) -> types.ModuleType:
    """``rlsdk.slime.<kind>``: every installed plugin of ``kind`` an attribute, adapted."""
    module = types.ModuleType(f"{__name__}.{kind}", f"Installed ``{kind}`` plugins as slime functions.")
    module.__getattr__, module.__dir__ = kind_module_hooks(kind)  # type: ignore[method-assign]
    return module


for _kind, _record in RECORD_TYPES.items():  # one submodule per slime extension point, from its declaration
    if _record.slime:
        sys.modules[f"{__name__}.{_kind}"] = globals()[_kind] = kind_module(_kind)
