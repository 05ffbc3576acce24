"""The plugin manager: discovers plugins through entry points and resolves implementations by name."""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import os
import warnings
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

import pluggy

from .._version import __version__
from ..errors import PluginConflictError, PluginError, UnknownPluginError
from . import hookspecs
from .real_slime import for_real_slime
from .loading import check_signature, is_async_callable, is_path, load_callable
from .kinds import KINDS, RECORD_TYPES, hook_name
from .records import Option, PluginInfo, PluginRecord, Resolved, normalize_name

ENTRY_POINT_GROUP = "rlsdk"
CORE_DISTRIBUTION = "rlsdk"
CORE_PLUGINS = {
    "defaults": "rlsdk.rollout.plugin",
    "training": "rlsdk.training.plugin",
    "agents": "rlsdk.agents.plugin",
    "run": "rlsdk.run.plugin",
}
"""Core's own plugins (the defaults, the torch trainer and its losses, the agents' generators and tool-call
parsers, the logging backends and the arithmetic environment), registered by import under these names, as
conda and llm register theirs: a source checkout has them without an installed entry point."""
STRICT_ENV = "RLSDK_STRICT_PLUGINS"
DISABLE_ENV = "RLSDK_DISABLE_PLUGINS"


@dataclass(frozen=True)
class PluginLoadFailure:
    """A plugin that was skipped because it failed to import or register."""

    entry_point: str
    distribution: str | None
    version: str | None
    error: str


class RlsdkPluginManager(pluggy.PluginManager):
    """A pluggy manager that keeps one table of named records per kind."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)
        self.failures: list[PluginLoadFailure] = []
        self._infos: dict[str, PluginInfo] = {}
        self._tables: dict[str, dict[str, list[tuple[PluginRecord, PluginInfo]]]] | None = None
        self._options: dict[str, tuple[Option, PluginInfo]] | None = None
        self._options_reserved: frozenset[str] = frozenset()

    # ----- registration -----------------------------------------------------------------------

    def register(self, plugin: Any, name: str | None = None, *, info: PluginInfo | None = None) -> str | None:
        """Register a module or object; a misspelled hook name is an error and nothing stays registered."""
        registered = super().register(plugin, name)
        if registered is None:
            return None
        try:
            self.check_pending()
        except pluggy.PluginValidationError as exc:
            self.unregister(name=registered)
            hooks = ", ".join([*map(hook_name, KINDS), "rlsdk_options"])
            raise PluginError(f"plugin {registered!r}: {exc} (known hooks: {hooks})") from None
        module = getattr(plugin, "__name__", None) or type(plugin).__module__
        self._infos[registered] = info or PluginInfo(plugin=registered, module=module)
        self._tables = self._options = None
        return registered

    def unregister(self, plugin: Any = None, name: str | None = None) -> Any:
        result = super().unregister(plugin, name)
        self._infos = {k: v for k, v in self._infos.items() if self.has_plugin(k)}
        self._tables = self._options = None
        return result

    def load_entrypoints(
        self, group: str = ENTRY_POINT_GROUP, *, distributions: Iterable[str] | None = None
    ) -> int:
        """Load every plugin of the entry-point group (only those of ``distributions`` when given); failures are
        reported and skipped."""
        strict = os.environ.get(STRICT_ENV, "") not in ("", "0")
        disabled = {n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()}
        wanted = None if distributions is None else set(distributions)
        count = 0
        for ep in _unique_entry_points(group):
            if ep.name in disabled or self.has_plugin(ep.name):
                continue
            dist = getattr(ep, "dist", None)
            dist_name = dist.metadata["Name"] if dist is not None else None
            if wanted is not None and dist_name not in wanted:
                continue
            version = dist.version if dist is not None else None
            try:
                plugin = ep.load()
                self.register(plugin, ep.name, info=PluginInfo(ep.name, dist_name, version, ep.value))
            except (Exception, SystemExit) as exc:  # a broken plugin (even one calling sys.exit) is skipped
                error = (
                    f"SystemExit({exc.code!r}) at import"
                    if isinstance(exc, SystemExit)
                    else f"{type(exc).__name__}: {exc}"
                )
                self._report(PluginLoadFailure(ep.name, dist_name, version, error), strict, exc)
                continue
            count += 1
        return count

    def _report(self, failure: PluginLoadFailure, strict: bool, exc: BaseException) -> None:
        """A plugin that failed to load or whose hook failed: fatal in strict mode, else warned and kept
        in ``failures``."""
        where = f"plugin {failure.entry_point!r} from {failure.distribution} {failure.version}"
        if strict:
            raise PluginError(f"{where} failed to load: {failure.error}") from exc
        self.failures.append(failure)
        warnings.warn(
            f"rlsdk: skipped {where}: {failure.error} "
            f"(set {STRICT_ENV}=1 to make this fatal, {DISABLE_ENV}={failure.entry_point} to silence it)",
            stacklevel=3,
        )

    def plugin_info(self, name: str) -> PluginInfo:
        return self._infos[name]

    def plugin_infos(self) -> list[PluginInfo]:
        return list(self._infos.values())

    def plugin_versions(self) -> dict[str, str | None]:
        """Distribution -> version of every plugin loaded (a run's state records them; Ray workers are
        checked against the driver's)."""
        return dict(
            sorted((info.distribution, info.version) for info in self.plugin_infos() if info.distribution)
        )

    # ----- tables of records ------------------------------------------------------------------

    def _collect(self) -> dict[str, dict[str, list[tuple[PluginRecord, PluginInfo]]]]:
        if self._tables is not None:
            return self._tables
        tables: dict[str, dict[str, list[tuple[PluginRecord, PluginInfo]]]] = {k: {} for k in KINDS}
        strict = os.environ.get(STRICT_ENV, "") not in ("", "0")
        for kind in KINDS:
            record_type = RECORD_TYPES[kind]
            caller = getattr(self.hook, hook_name(kind))
            for impl in caller.get_hookimpls():
                info = self._infos.get(self.get_name(impl.plugin) or "", PluginInfo(plugin=impl.plugin_name))
                try:
                    records = _as_records(impl.function())
                    wrong = [r for r in records if not isinstance(r, record_type)]
                    if wrong:
                        raise PluginError(
                            f"returned {wrong[0]!r:.200}, expected {record_type.__name__} records"
                        )
                except (Exception, SystemExit) as exc:  # one broken hook must not break every command
                    error = f"hook {hook_name(kind)} " + (
                        str(exc) if isinstance(exc, PluginError) else f"raised {type(exc).__name__}: {exc}"
                    )
                    self._report(
                        PluginLoadFailure(info.plugin, info.distribution, info.version, error), strict, exc
                    )
                    continue
                for record in records:
                    tables[kind].setdefault(record.name, []).append((record, info))
        self._tables = tables
        return tables

    def names(self, kind: str) -> list[str]:
        """The registered names of one kind, sorted."""
        return sorted(self._collect()[_check_kind(kind)])

    def records(self, kind: str) -> dict[str, list[tuple[PluginRecord, PluginInfo]]]:
        """Name -> every (record, provenance) providing it; more than one entry is a conflict."""
        return self._collect()[_check_kind(kind)]

    def conflicts(self) -> list[tuple[str, str, list[PluginInfo]]]:
        """(kind, name, providers) for each name provided more than once."""
        return [
            (kind, name, [info for _, info in providers])
            for kind, table in self._collect().items()
            for name, providers in sorted(table.items())
            if len(providers) > 1
        ]

    def options(self, reserved: Collection[str] = ()) -> dict[str, tuple[Option, PluginInfo]]:
        """Name -> (option, provenance) of every run option the plugins declare (``rlsdk_options``). Two plugins
        may declare one option alike; declaring it differently is a conflict naming both. A plugin declaring
        a ``reserved`` name (core's options, :meth:`rlsdk.RolloutConfig.option_names`) is reported and
        skipped."""
        core = frozenset(reserved)
        if self._options is not None and self._options_reserved == core:
            return self._options
        strict = os.environ.get(STRICT_ENV, "") not in ("", "0")
        options: dict[str, tuple[Option, PluginInfo]] = {}
        for impl in self.hook.rlsdk_options.get_hookimpls():
            info = self._infos.get(self.get_name(impl.plugin) or "", PluginInfo(plugin=impl.plugin_name))
            try:
                declared: list[Any] = _as_records(impl.function())
                wrong = [o for o in declared if not isinstance(o, Option)]
                if wrong:
                    raise PluginError(f"returned {wrong[0]!r:.200}, expected Option records")
                shadowing = [o.name for o in declared if o.name in core]
                if shadowing:
                    raise PluginError(f"declares {shadowing}, which are core options")
            except (Exception, SystemExit) as exc:  # one broken hook must not break every command
                error = "hook rlsdk_options " + (
                    str(exc) if isinstance(exc, PluginError) else f"raised {type(exc).__name__}: {exc}"
                )
                self._report(
                    PluginLoadFailure(info.plugin, info.distribution, info.version, error), strict, exc
                )
                continue
            for option in declared:
                if option.name in options and options[option.name][0] != option:
                    raise PluginConflictError(
                        f"option {option.name!r} is declared differently by {options[option.name][1].describe()} "
                        f"and {info.describe()}. Uninstall one, or block one with {DISABLE_ENV}=<entry point>"
                    )
                options.setdefault(option.name, (option, info))
        self._options, self._options_reserved = options, core
        return options

    # ----- resolution ------------------------------------------------------------------------

    def resolve(
        self, kind: str, spec: str, *, registered_only: bool = False, **record_options: Any
    ) -> Resolved[Any]:
        """Resolve a registered name or a dotted/file path to a validated callable.

        ``registered_only=True`` refuses paths, for names that come from the network: a path would load
        and run any code the sender names. ``record_options`` fill record fields for paths (e.g.
        ``group=True`` for a dotted-path reward).
        """
        kind = _check_kind(kind)
        if not isinstance(spec, str) or not spec.strip():
            raise PluginError(f"empty {kind} name")
        spec = spec.strip()
        if registered_only and is_path(spec):
            raise UnknownPluginError(
                f"{kind} {spec[:100]!r} is a path: only registered names are accepted here. "
                f"Choose one of: {', '.join(self.names(kind)) or 'none'}"
            )
        if is_path(spec):
            func = for_real_slime(kind, load_callable(spec))  # slime's own samples, when slime is installed
            record = RECORD_TYPES[kind](
                name=spec.replace(".", "_").replace(":", "_").replace("/", "_"), func=func, **record_options
            )
            info = PluginInfo(plugin=spec, module=getattr(func, "__module__", None))
        else:
            name = normalize_name(spec)
            providers = self.records(kind).get(name)
            if not providers:
                close = difflib.get_close_matches(name, self.names(kind), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                installed = ", ".join(self.names(kind)) or "none"
                raise UnknownPluginError(
                    f"unknown {kind} {name!r}{hint}. Choose one of: {installed} "
                    f"(plugin may not be installed), or give a dotted path 'pkg.mod:fn'"
                )
            if len(providers) > 1:
                who = "; ".join(info.describe() for _, info in providers)
                raise PluginConflictError(
                    f"{kind} {name!r} is provided by more than one plugin: {who}. "
                    f"Uninstall one, or block one with {DISABLE_ENV}=<entry point>"
                )
            record, info = providers[0]
        where = f"{kind} {record.name!r} from {info.describe()}"
        accepts_evaluation = check_signature(
            record.func, record.signature_args(), where, record.call_keywords
        )
        return Resolved(
            record, info, is_async=is_async_callable(record.func), accepts_evaluation=accepts_evaluation
        )


def _check_kind(kind: str) -> str:
    if kind not in RECORD_TYPES:
        raise PluginError(f"unknown plugin kind {kind!r}. Choose one of: {', '.join(KINDS)}")
    return kind


def _as_records(result: Any) -> list[PluginRecord]:
    if result is None:
        return []
    if isinstance(result, PluginRecord):
        return [result]
    if isinstance(result, Iterable):
        return list(result)
    return [result]


def _unique_entry_points(group: str) -> list[importlib.metadata.EntryPoint]:
    """Entry points of ``group``, once per (name, value) even when a distribution is on the path twice."""
    seen: set[tuple[str, str]] = set()
    unique = []
    for ep in importlib.metadata.entry_points(group=group):
        if (ep.name, ep.value) not in seen:
            seen.add((ep.name, ep.value))
            unique.append(ep)
    return unique


def get_plugin_manager(*, load_entrypoints: bool = True, plugins: Iterable[Any] = ()) -> RlsdkPluginManager:
    """Build a plugin manager: ``plugins``, core's own (:data:`CORE_PLUGINS`: the defaults are part of core, a
    manager without them could not run a step), then the installed plugins unless ``load_entrypoints`` is
    False."""
    pm = RlsdkPluginManager()
    for plugin in plugins:
        pm.register(plugin)
    for name, module in CORE_PLUGINS.items():  # by name: they live on the floors above the plugin system
        info = PluginInfo(name, CORE_DISTRIBUTION, __version__, module)
        pm.register(importlib.import_module(module), name, info=info)
    if load_entrypoints:
        pm.load_entrypoints()
    return pm
