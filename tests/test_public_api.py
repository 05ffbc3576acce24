"""The public API's promise: every public name imports, the committed snapshot matches, old names forward
with a DeprecationWarning naming the replacement, and rlsdk's own plugins import only the public API."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import rlsdk
import rlsdk.testing
from rlsdk import _moved
from rlsdk.testing import check_custom_generate, check_reward

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import api_snapshot  # noqa: E402

PUBLIC_MODULES = {"rlsdk", "rlsdk.testing"}


@pytest.mark.parametrize("module", [rlsdk, rlsdk.testing], ids=["rlsdk", "rlsdk.testing"])
def test_every_public_name_imports(module):
    missing = [name for name in module.__all__ if getattr(module, name, None) is None]
    assert not missing


def test_the_public_api_matches_its_committed_snapshot():
    """A change to the public API is deliberate: update api/rlsdk.txt with `python scripts/api_snapshot.py
    --write` and add a CHANGELOG line (Added, Deprecated or Breaking)."""
    committed = api_snapshot.SNAPSHOT.read_text()
    now = api_snapshot.snapshot()
    assert now == committed, "the public API changed: run `python scripts/api_snapshot.py --write` and say so in CHANGELOG.md"


def test_import_rlsdk_loads_no_torch_transformers_or_aiohttp():
    code = "import sys, rlsdk; print(sorted(m for m in ('torch', 'transformers', 'aiohttp') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


OLD_NAMES = [
    # (old path, name, what the warning must name)
    ("rlsdk.generate", "model_turn", "rlsdk.model_turn"),
    ("rlsdk.generate", "append_observation", "rlsdk.append_observation"),
    ("rlsdk.generate", "generate", "rlsdk.single_turn"),
    ("rlsdk.tools", "call_tool", "rlsdk.call_tool"),
    ("rlsdk.engine", "InferenceEngine", "rlsdk.InferenceEngine"),
    ("rlsdk.protocol", "EngineRequestError", "rlsdk.EngineRequestError"),
    ("rlsdk.rollout.job", "run_job", "rlsdk.run.job.run_job"),
    ("rlsdk.engines.server", "start_server", "rlsdk.run.engine_server.start_server"),
    ("rlsdk.plugins.defaults", "pop_first", "rlsdk.rollout.plugin.pop_first"),
    ("rlsdk.training.options", "trainer_world_size", "rlsdk.trainer_world_size"),
    ("rlsdk.training", "PolicyTrainer", "rlsdk.PolicyTrainer"),
    ("rlsdk.engines.engine", "SGLangClient", "rlsdk.SGLangClient"),
    ("rlsdk.rollout.buffer_service", "TOKEN_ENV", "rlsdk.BUFFER_TOKEN_ENV"),
]


@pytest.mark.parametrize(("old", "name", "replacement"), OLD_NAMES, ids=[f"{o}.{n}" for o, n, _ in OLD_NAMES])
def test_an_old_name_still_works_and_warns_naming_its_replacement(old, name, replacement):
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} is deprecated .*use {replacement}"):
        value = getattr(module, name)
    assert value is not None


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_every_moved_module_path_still_imports_and_forwards(old):
    module = importlib.import_module(old)
    target = importlib.import_module(_moved.MOVED[old])
    public = [n for n in dir(target) if not n.startswith("_") and not isinstance(getattr(target, n), type(sys))]
    if public:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            assert getattr(module, public[0]) is getattr(target, public[0])


def test_a_plugin_written_against_the_previous_readme_still_works(rlsdk_pm):
    """tests/fixtures/old_readme_plugin is a plugin as rlsdk 0.1's README taught (``rlsdk.generate``,
    ``rlsdk.runtime``): it runs unchanged through the kit's checks, with deprecation warnings."""
    sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "old_readme_plugin"))
    try:
        with pytest.warns(DeprecationWarning, match="use rlsdk.model_turn"):
            plugin = importlib.import_module("my_agent.plugin")
        rlsdk_pm.register(plugin)
        check_reward(rlsdk_pm, "exact")
        sample = check_custom_generate(rlsdk_pm, "two_turns", replies=["Thinking.", "The answer is 5."])
        assert sample.status == sample.Status.COMPLETED
        assert "Observation: ok" in sample.response and sample.response.endswith("The answer is 5.")
        single = check_custom_generate(rlsdk_pm, "one_turn", replies=["5"])
        assert single.response == "5"
    finally:
        sys.path.remove(str(ROOT / "tests" / "fixtures" / "old_readme_plugin"))
        sys.modules.pop("my_agent.plugin", None)
        sys.modules.pop("my_agent", None)


def _rlsdk_imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [(node.lineno, n) for n in names if n == "rlsdk" or n.startswith("rlsdk.")]
    return found


def test_rlsdks_own_plugins_import_only_the_public_api():
    """What an outside author's package may import, rlsdk's own plugin packages import: ``rlsdk`` and
    ``rlsdk.testing`` (and ``rlsdk.slime.<kind>`` adapter paths, which slime loads by name)."""
    sources = sorted((ROOT / "plugins").glob("*/src/**/*.py"))
    assert sources
    internal = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in sources
        for line, module in _rlsdk_imports(path)
        if module not in PUBLIC_MODULES
    ]
    assert not internal, "plugins import rlsdk internals:\n" + "\n".join(internal)
