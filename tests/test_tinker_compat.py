"""The Tinker compatibility report holds: scripts/tinker_compat.py's checks, run against ``rlsdk tinker serve``
(the tiny Llama, CPU) with the real ``tinker`` client, give every method the status docs/tinker-compat.json
records. A method that passed and now fails is a regression; one that now passes, or a client whose methods
changed, means the report is out of date (run ``python scripts/tinker_compat.py``)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

tinker = pytest.importorskip("tinker")

pytestmark = pytest.mark.plugins("rlsdk_embedded")

ROOT = Path(__file__).resolve().parent.parent


def load_script():
    spec = importlib.util.spec_from_file_location("tinker_compat", ROOT / "scripts" / "tinker_compat.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_method_keeps_the_status_the_report_records(tiny_llama, tmp_path):
    from rlsdk_embedded.engine import EmbeddedEngine

    from rlsdk.tinker.server import ServerThread
    from rlsdk.tinker.service import TinkerService
    from rlsdk.tinker.training import Placement

    script = load_script()
    report = json.loads(script.REPORT_JSON.read_text())
    assert report["tinker"] == tinker.__version__, "the pinned client changed: regenerate the report"
    service = TinkerService(
        {script.NAME: tiny_llama},
        lambda folder: EmbeddedEngine(str(folder), device="cpu", threads=1),
        tmp_path / "checkpoints",
        Placement("cpu", "float32", 1),
    )
    with ServerThread(service, [script.KEY]) as url:
        rows = script.run_checks(url, tiny_llama)
    now = {row["method"]: row for row in rows}
    recorded = {row["method"]: row for row in report["methods"]}
    assert sorted(now) == sorted(recorded), "the client's public methods changed: regenerate the report"
    regressed = [
        f"{m}: {now[m]['checked']}"
        for m, row in recorded.items()
        if row["supported"] == "yes" != now[m]["supported"]
    ]
    assert not regressed, "methods that passed no longer do:\n" + "\n".join(regressed)
    newly = [m for m, row in now.items() if row["supported"] != recorded[m]["supported"]]
    assert not newly, f"statuses changed (update the report: python scripts/tinker_compat.py): {newly}"
    assert sum(row["supported"] == "yes" for row in rows) >= 81
    rendered = script.render(report["methods"], report["tinker"])
    assert script.REPORT_MD.read_text() == rendered, "docs/tinker-compat.md is not the JSON's rendering"
