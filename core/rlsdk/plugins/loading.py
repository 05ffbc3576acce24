"""Loading callables from dotted or file paths, and validating their signatures once; never code that a
file not trusted to name code (a run folder another machine wrote) names (:func:`refusing_code`)."""

from __future__ import annotations

import importlib
import importlib.resources
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import PluginError
from . import slime_layer


def is_path(spec: str) -> bool:
    """A registered name has no '.', ':' or '/'; anything else is a dotted or file path."""
    return any(ch in spec for ch in ".:/")


_GUARDS: list[tuple[dict[str, str], list[str]]] = []
"""The :func:`refusing_code` blocks running: (untrusted text -> why, allowed texts)."""


@contextmanager
def refusing_code(untrusted: Mapping[str, str], allowed: Iterable[str] = ()) -> Iterator[None]:
    """While the block runs, a dotted or file path that occurs in one of the ``untrusted`` texts (each
    mapped to why it is not trusted, naming where it comes from) and in none of the ``allowed`` ones (what
    the command line names) is never imported: :func:`load_callable` raises a PluginError saying why."""
    guard = ({text: why for text, why in untrusted.items() if text}, [text for text in allowed if text])
    _GUARDS.append(guard)
    try:
        yield
    finally:
        _GUARDS.remove(guard)


def check_trusted(spec: str) -> None:
    """PluginError when ``spec`` (a path or module to import) comes from a text not trusted to name code."""
    spec = spec.strip()
    for untrusted, allowed in _GUARDS:
        if not spec or any(spec in text for text in allowed):
            continue
        for text, why in untrusted.items():
            if spec in text:
                raise PluginError(f"{spec[:200]!r} is not loaded: {why}")


def load_callable(spec: str) -> Callable[..., Any]:
    """Load ``pkg.mod:fn``, ``pkg.mod.fn`` or ``path/to/file.py:fn``."""
    check_trusted(spec)
    if ":" in spec:
        module_part, _, attr = spec.rpartition(":")
    else:
        module_part, _, attr = spec.rpartition(".")
    if not module_part or not attr:
        raise PluginError(f"cannot load {spec!r}: expected 'pkg.mod:fn', 'pkg.mod.fn' or 'file.py:fn'")
    slime_layer.install()  # slime's functions import slime's modules: rlsdk's stand in when slime is absent
    if module_part.endswith(".py"):
        module = _load_file(Path(module_part), spec)
    else:
        try:
            module = importlib.import_module(module_part)
        except ImportError as exc:
            raise PluginError(f"cannot load {spec!r}: importing {module_part!r} failed: {exc}") from exc
        except SystemExit as exc:  # a module calling sys.exit() at import must not end the command silently
            raise PluginError(f"cannot load {spec!r}: importing {module_part!r} raised {exc!r}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginError(f"cannot load {spec!r}: {module_part!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise PluginError(f"{spec!r} is not callable: {obj!r}")
    return obj


def _load_file(path: Path, spec: str) -> Any:
    path = path.expanduser().resolve()
    if not path.is_file():
        raise PluginError(f"cannot load {spec!r}: file {str(path)!r} does not exist")
    module_name = f"rlsdk_file_{abs(hash(str(path)))}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    if str(path.parent) not in sys.path:  # sibling imports, as slime's examples do (`from prompts import`)
        sys.path.insert(0, str(path.parent))
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # sys.exit() at import must not end the command silently
        del sys.modules[module_name]
        raise PluginError(f"cannot load {spec!r}: executing {str(path)!r} failed: {exc!r}") from exc
    return module


def is_async_callable(func: Callable[..., Any]) -> bool:
    while hasattr(func, "func") and not inspect.isfunction(func):  # functools.partial
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))


def check_signature(
    func: Callable[..., Any], call_args: tuple[str, ...], where: str, keywords: tuple[str, ...] = ()
) -> bool:
    """Check that ``func`` accepts ``call_args`` positionally and ``keywords`` by name; return whether it takes
    ``evaluation``."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return False  # builtins without signatures: trust them
    expected = f"({', '.join([*call_args, *(f'{k}=' for k in keywords)])}, ...)"
    try:
        signature.bind(*call_args, **dict.fromkeys(keywords))
    except TypeError as exc:
        raise PluginError(
            f"{where}: signature {signature} does not accept the call {expected}: {exc}"
        ) from None
    params = signature.parameters
    return "evaluation" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def package_file(package: str, relative: str) -> str:
    """The path of the file ``relative`` inside the installed ``package`` (its data, found with
    :mod:`importlib.resources`), for an environment's dataset; a missing file is a PluginError."""
    try:
        path = importlib.resources.files(package).joinpath(relative)
    except ModuleNotFoundError as exc:
        raise PluginError(f"package_file: no package {package!r}: {exc}") from None
    if not path.is_file():
        raise PluginError(f"package_file: {package!r} has no file {relative!r} (is it in the package data?)")
    return str(path)
