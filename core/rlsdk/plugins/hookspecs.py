"""Hook specifications: one provider hook per kind of plugin, derived from the kind's declaration
(:mod:`rlsdk.plugins.kinds`), and ``rlsdk_options``.

Each hook returns (or yields) records with a name; the plugin manager collects them into one table per kind
and the engine loop resolves implementations by name. Pluggy is used for discovery only: the loop calls the
resolved callables directly. A hook's documentation is its record's (``rlsdk_rewards``: :class:`rlsdk.Reward`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pluggy

from .kinds import RECORD_TYPES
from .records import Option, PluginRecord

PROJECT = "rlsdk"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


def provider_hook(record: type[PluginRecord]) -> Callable[[], Iterable[PluginRecord]]:
    """The provider hookspec of ``record``'s kind, named by its hook and documented by its docstring."""

    def provide() -> Iterable[PluginRecord]:
        raise NotImplementedError  # a specification: pluggy never calls it

    provide.__name__ = provide.__qualname__ = record.hook_name()
    provide.__doc__ = (
        f"Provide :class:`rlsdk.{record.__name__}` records ({record.kind} plugins).\n\n{record.__doc__}"
    )
    return hookspec(provide)


globals().update({record.hook_name(): provider_hook(record) for record in RECORD_TYPES.values()})


@hookspec
def rlsdk_options() -> Iterable[Option]:
    """Declare the run options this plugin reads from ``args``: ``rlsdk run --help`` and ``rlsdk plugins show``
    list them, and a config file, ``--set`` or a flag with a wrong type or a misspelled key is an error.
    ``args.<name>`` reads the option's default when the run does not set it.

    **Example:**

    .. code-block:: python

        from rlsdk import Option, hookimpl

        @hookimpl
        def rlsdk_options():
            yield Option(name="retriever_url", type=str, help="URL of the retrieval server")
            yield Option(name="retriever_topk", type=int, default=3, help="Passages per search")
    """
    raise NotImplementedError
