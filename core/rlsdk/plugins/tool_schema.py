"""A tool's JSON schema (OpenAI's function ``parameters``) from its signature and docstring.

``def search(args, query: str, top_k: int = 3)`` documented with ``:param query: what to look for`` (or a
Google-style ``Args:`` section) gives ``{"type": "object", "properties": {"query": {"type": "string",
"description": "what to look for"}, "top_k": {"type": "integer", "default": 3}}, "required": ["query"]}``.
The first parameter is the run's ``args`` and is left out; parameters without a default are required.
"""

from __future__ import annotations

import enum
import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any

from ..errors import PluginError

JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
}
_GOOGLE_ARG = re.compile(r"^\s{2,}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$")
_SPHINX_PARAM = re.compile(r"^\s*:param\s+(?:[\w\[\], |.]+\s+)?(\w+)\s*:\s*(.+)$")


def schema_from_signature(func: Callable[..., Any], where: str = "tool") -> dict[str, Any]:
    """The JSON schema of ``func``'s parameters after ``args``; a ``**kwargs``-only tool takes one string
    ``query`` (the default of tools without a schema)."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError) as exc:
        raise PluginError(f"{where}: no signature to build a schema from ({exc}); give parameters") from None
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # an annotation that does not resolve: its parameters are documented as untyped
        hints = {}
    params = list(signature.parameters.values())[1:]  # the run's args
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not named:
        return {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
    docs = parameter_docs(inspect.getdoc(func) or "")
    properties: dict[str, Any] = {}
    required = []
    for param in named:
        prop = json_type(hints.get(param.name, param.annotation), f"{where}: parameter {param.name!r}")
        if param.name in docs:
            prop["description"] = docs[param.name]
        if param.default is param.empty:
            required.append(param.name)
        elif param.default is not None:
            prop["default"] = param.default.value if isinstance(param.default, enum.Enum) else param.default
        properties[param.name] = prop
    return {"type": "object", "properties": properties, "required": required}


def json_type(annotation: Any, where: str) -> dict[str, Any]:
    """The JSON schema of one annotation: str, int, float, bool, list[X], dict, Literal[...], an Enum, X | None;
    a missing annotation is a string (what a tag-style call passes)."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {"type": "string"} if annotation is inspect.Parameter.empty else {}
    if annotation in JSON_TYPES:
        return {"type": JSON_TYPES[annotation]}
    origin, type_args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        kinds = {JSON_TYPES.get(type(v)) for v in type_args}
        return (
            {"type": kinds.pop(), "enum": list(type_args)} if len(kinds) == 1 else {"enum": list(type_args)}
        )
    if origin in (typing.Union, types.UnionType):
        options = [a for a in type_args if a is not type(None)]
        return (
            json_type(options[0], where)
            if len(options) == 1
            else {"anyOf": [json_type(a, where) for a in options]}
        )
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {
            "type": JSON_TYPES.get(type(next(iter(annotation)).value), "string"),
            "enum": [m.value for m in annotation],
        }
    if annotation in (list, tuple) or origin in (list, tuple, set, frozenset):
        return {"type": "array", **({"items": json_type(type_args[0], where)} if type_args else {})}
    if annotation is dict or origin is dict:
        return {"type": "object"}
    raise PluginError(
        f"{where}: cannot describe the annotation {annotation!r} in JSON schema; give parameters"
    )


def parameter_docs(doc: str) -> dict[str, str]:
    """Parameter descriptions from a docstring's ``:param name: text`` lines or its Google-style ``Args:``."""
    found: dict[str, str] = {}
    in_args = False
    for line in doc.splitlines():
        sphinx = _SPHINX_PARAM.match(line)
        if sphinx:
            found[sphinx.group(1)] = sphinx.group(2).strip()
            continue
        if line.strip() in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args:
            google = _GOOGLE_ARG.match(line)
            if google:
                found[google.group(1)] = google.group(2).strip()
            elif line.strip() and not line.startswith(" "):
                in_args = False
    return found
