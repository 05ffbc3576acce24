"""What every kind of plugin shares: the record a provider hook returns (:class:`PluginRecord`, whose subclasses in
:mod:`rlsdk.plugins.kinds` declare each kind once), the run options a plugin reads (:class:`Option`), and a
record resolved for a run (:class:`Resolved`, with its provenance :class:`PluginInfo`)."""

from __future__ import annotations

from argparse import Namespace

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Never, TypeVar
from ..options import RunOptions


PluginArgs = Never
"""The type of a kind's ``args`` in its call ``Protocol``: the run's options, of whatever type the plugin
names them (``rlsdk.RolloutConfig``, slime's ``argparse.Namespace``, unannotated): as the bottom type, any
function accepts it, so a protocol checks a plugin's arity and its other arguments, not how it types ``args``."""


def normalize_name(name: str) -> str:
    """Registered names are compared lower-cased and stripped."""
    return name.strip().lower()


OPTION_TYPES: tuple[type, ...] = (str, int, float, bool, list, dict)
TYPE_NAMES = {
    int: "an integer",
    float: "a number",
    str: "a string",
    bool: "true or false",
    list: "a list",
    dict: "a mapping",
}
"""How an option's type is named in its error message."""


@dataclass
class Option:
    """A run option a plugin reads from ``args`` (``args.<name>``): declared so that ``rlsdk run --help`` and
    ``rlsdk plugins show`` list it and a value of the wrong type, or a misspelled key, is an error.

    ``type`` is ``str``, ``int``, ``float``, ``bool``, ``list`` or ``dict``; ``default`` is what
    ``args.<name>`` reads when the run does not set it (None: unset); ``choices`` limits the values."""

    name: str
    type: type
    default: Any = None
    help: str = ""
    choices: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip().isidentifier():
            raise ValueError(f"an option name must be an identifier, got {self.name!r}")
        self.name = normalize_name(self.name)
        if self.type not in OPTION_TYPES:
            raise TypeError(
                f"option {self.name!r}: type must be one of "
                f"{', '.join(t.__name__ for t in OPTION_TYPES)}, got {self.type!r}"
            )
        if self.default is not None:
            self.default = self.check(self.default)

    def check(self, value: Any) -> Any:
        """``value`` as this option's type (an int for a float option becomes a float); ValueError when it is
        not one, or not one of ``choices``."""
        if value is None:
            return None
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif self.type is list and isinstance(value, str):  # one item, as --set key=item gives it
            value = [value]
        elif self.type is str and isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, self.type) or (self.type is int and isinstance(value, bool)):
            kind = TYPE_NAMES.get(self.type, f"a {self.type.__name__}")
            raise ValueError(f"option {self.name!r} takes {kind}, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise ValueError(
                f"option {self.name!r} must be one of {', '.join(map(str, self.choices))}, got {value!r}"
            )
        return value


@dataclass
class PluginRecord:
    """A named implementation of one kind; ``func`` is what the engine loop calls."""

    kind: ClassVar[str] = ""
    hook: ClassVar[str] = ""
    """The provider hook's name; ``rlsdk_<kind>s`` unless a record type says otherwise."""
    call_args: ClassVar[tuple[str, ...]] = ()
    """Positional arguments the loop passes, in the plugin's order (every call point takes the resolved
    plugin, then these), used to validate the callable's signature."""
    call_keywords: ClassVar[tuple[str, ...]] = ()
    """Keyword arguments the loop passes (slime calls some hooks by keyword), validated the same way."""
    scope: ClassVar[str] = "run"
    """When the plugin is called: per ``sample``, ``group``, ``step``, ``eval``, ``micro_batch``,
    ``checkpoint``, ``sync``, ``call`` (a tool call), ``request`` (a served request) or once per ``run``."""
    options: ClassVar[tuple[Option, ...]] = ()
    """The run options that name the run's plugin of this kind, the first the main one (``rm_type``,
    ``rollout_data_postprocess_path``): core options, on the command line and in config files."""
    default: ClassVar[str | None] = None
    """The plugin a run uses when its option names none (and the option's default is None)."""
    many: ClassVar[bool] = False
    """The option names several plugins, applied in order (a list, or names joined by commas)."""
    slime: ClassVar[bool] = False
    """One of slime's extension points: its option is slime's argument, and its installed plugins are slime
    functions at ``rlsdk.slime.<kind>.<name>``."""

    name: str
    func: Callable[..., Any]
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"a {self.kind} record needs a non-empty name, got {self.name!r}")
        self.name = normalize_name(self.name)
        if "." in self.name or ":" in self.name or "/" in self.name:
            raise ValueError(f"{self.kind} name {self.name!r} may not contain '.', ':' or '/'")
        if not callable(self.func):
            raise TypeError(f"{self.kind} {self.name!r}: func must be callable, got {self.func!r}")
        if not self.description:
            doc = (getattr(self.func, "__doc__", None) or "").strip()
            self.description = doc.splitlines()[0] if doc else ""

    def signature_args(self) -> tuple[str, ...]:
        """The positional arguments the callable must accept: :attr:`call_args`, for most kinds."""
        return self.call_args

    @classmethod
    def hook_name(cls) -> str:
        """The provider hook: ``rlsdk_<kind>s`` unless :attr:`hook` says otherwise."""
        return cls.hook or f"rlsdk_{cls.kind}s"

    @classmethod
    def result_problem(cls, result: Any) -> str | None:
        """Why ``result`` is not what a plugin of this kind returns (None: it is), for the generic call point
        (:func:`rlsdk.plugins.calls.call_plugin`). Any result, unless a kind says otherwise."""
        return None

    @classmethod
    def chosen(cls, args: RunOptions | Namespace) -> Any:
        """What the run ``args`` name for this kind: its first option's value, else :attr:`default`. A name
        or path (a list of them for :attr:`many` kinds); None: no plugin of this kind."""
        if not cls.options:
            return cls.default
        return getattr(args, cls.options[0].name, None) or cls.default


@dataclass(frozen=True)
class PluginInfo:
    """Where a record came from: the entry point and distribution that registered it."""

    plugin: str
    distribution: str | None = None
    version: str | None = None
    module: str | None = None

    def describe(self) -> str:
        if self.distribution:
            return f"{self.distribution} {self.version or ''}".strip()
        return f"plugin {self.plugin!r}"


RecordT = TypeVar("RecordT", bound=PluginRecord)


@dataclass
class Resolved(Generic[RecordT]):
    """A record resolved by name or path, with its provenance and call facts checked once. Resolving by a kind's
    name gives ``Resolved[Any]``: the record's kind-specific fields (``group``, ``cheap``) are read as given."""

    record: RecordT
    info: PluginInfo
    is_async: bool = False
    accepts_evaluation: bool = False

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def kind(self) -> str:
        return self.record.kind

    @property
    def func(self) -> Callable[..., Any]:
        return self.record.func

    def describe(self) -> str:
        return f"{self.kind} {self.name!r} from {self.info.describe()}"
