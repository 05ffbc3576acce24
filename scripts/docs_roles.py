"""A griffe extension for the documentation site (mkdocs.yml, mkdocstrings ``extensions:``): Sphinx's
cross-reference roles in docstrings (``:func:`name```, ``:class:`~pkg.mod.Name```, ...) become code, as
Sphinx shows them (``~`` keeps the last part of the name); mkdocstrings would print the role as text."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|meth|class|data|attr|mod|exc|obj|const):`(~?)([^`]+)`")


def as_code(match: re.Match[str]) -> str:
    short, name = match.groups()
    return f"`{name.rsplit('.', 1)[-1] if short else name}`"


def without_roles(text: str) -> str:
    """``text`` with each Sphinx role written as code."""
    return ROLE.sub(as_code, text)


class SphinxRoles(griffe.Extension):
    """Rewrites every loaded object's docstring with :func:`without_roles`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = without_roles(obj.docstring.value)
