"""Fixtures shared by the cross-package tests."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest


@pytest.fixture
def fake_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Install a plugin distribution as a real ``.dist-info`` folder plus module on ``sys.path``.

    ``fake_dist(dist, version, entry_point, module, source)`` writes ``module.py`` with ``source`` and an
    ``rlsdk`` entry point ``entry_point = module``, exactly what pip would leave behind.
    """
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    created: list[str] = []

    def make(dist: str, version: str, entry_point: str, module: str, source: str) -> Path:
        (site / f"{module}.py").write_text(textwrap.dedent(source))
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[rlsdk]\n{entry_point} = {module}\n")
        created.append(module)
        importlib.invalidate_caches()
        return site

    yield make
    for module in created:
        sys.modules.pop(module, None)


@pytest.fixture
def pm(rlsdk_pm):
    """A fresh plugin manager with filter_hub registered (pop_last and drop_stale beside core's pop_first)."""
    import rlsdk_filter_hub.plugin

    rlsdk_pm.register(rlsdk_filter_hub.plugin)
    return rlsdk_pm
