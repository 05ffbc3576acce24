"""Every kind of plugin, each declared once as a record class (:mod:`.rollout`, :mod:`.agents`,
:mod:`.training`): its name, its call as a typed ``Protocol``, its record's fields, the run options naming it,
its default, and when it is called. Everything else about a kind is derived from the declaration here or
written against it in one place: the provider hook (:mod:`rlsdk.plugins.hookspecs`), the resolution and the
run's choice (:class:`rlsdk.plugins.run_plugins.RunPlugins`), the call point (:mod:`rlsdk.plugins.calls`), the
testing kit's check (:func:`rlsdk.testing.check_plugin`), the scaffold, the slime adapter
(:mod:`rlsdk.slime`), the public name (``rlsdk``) and the docs' table of kinds.

A new kind is a record class in one of these modules (and its ``__all__``), its default plugin, and its test.
"""

from __future__ import annotations

from types import ModuleType

from ..records import Option as Option  # what the records share, here too: 0.1's rlsdk.records forwards here
from ..records import PluginInfo as PluginInfo
from ..records import PluginRecord
from ..records import Resolved as Resolved
from ..records import normalize_name as normalize_name
from . import agents, rollout, training
from .agents import *  # noqa: F403 (each module's __all__ is its records)
from .rollout import *  # noqa: F403
from .training import *  # noqa: F403


def _declared(*modules: ModuleType) -> dict[str, type[PluginRecord]]:
    """Kind name -> record class, in the order the modules declare them."""
    return {
        record.kind: record
        for module in modules
        for record in vars(module).values()
        if isinstance(record, type)
        and issubclass(record, PluginRecord)
        and record.__module__ == module.__name__
        and record.kind
    }


RECORD_TYPES: dict[str, type[PluginRecord]] = _declared(rollout, agents, training)
"""Kind name -> record class."""
KINDS: tuple[str, ...] = tuple(RECORD_TYPES)

__all__ = [*rollout.__all__, *agents.__all__, *training.__all__]


def hook_name(kind: str) -> str:
    """The provider hook of ``kind`` (``rlsdk_<kind>s`` unless its record says otherwise)."""
    return RECORD_TYPES[kind].hook_name()


def kind_options() -> dict[str, tuple[type[PluginRecord], int]]:
    """Option name -> (the record whose option it is, its position among the record's options)."""
    return {
        option.name: (record, position)
        for record in RECORD_TYPES.values()
        for position, option in enumerate(record.options)
    }
