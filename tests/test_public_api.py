"""The public API's promise: every public name imports, the committed snapshot matches, old names forward
with a DeprecationWarning naming the replacement, and rlsdk's own plugins import only the public API."""

from __future__ import annotations

import ast
import importlib
import re
import json
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
import api_check  # noqa: E402

PUBLIC_MODULES = {"rlsdk", "rlsdk.testing", "rlsdk.engine_api", "rlsdk.trainer_api", "rlsdk.slime"}
"""The public modules by audience: plugin authors, their tests, engine and trainer implementers, and slime's
adapters (``rlsdk.slime.<kind>`` paths, which slime loads by name)."""


@pytest.mark.parametrize("module", [rlsdk, rlsdk.testing], ids=["rlsdk", "rlsdk.testing"])
def test_every_public_name_imports(module):
    missing = [name for name in module.__all__ if getattr(module, name, None) is None]
    assert not missing


def test_the_public_api_keeps_its_promise_against_the_released_baseline():
    """``scripts/api_check.py`` (also a CI step): every addition since api/rlsdk.json has a CHANGELOG line,
    every removed or changed name a Deprecated (or deliberate Breaking) one."""
    found = api_check.problems(
        json.loads(api_check.BASELINE.read_text()), api_check.public_api(), api_check.CHANGELOG.read_text()
    )
    assert not found, "\n".join(found)


CHANGELOG = """## Unreleased

### Added
- `shiny_new`.

### Deprecated
- `old_name`, use `new_name`.

## 0.1.0
"""


def test_the_api_check_tells_an_addition_from_a_break():
    """griffe compares each public object: a new name needs a line, a parameter gone or moved is a break
    unless the name is deprecated; a name removed is a break unless deprecated."""
    api = api_check.public_api()
    baseline = {path: api[path] for path in ("rlsdk.call_tool", "rlsdk.reward_value", "rlsdk.Sample")}
    current = dict(baseline)
    current["rlsdk.shiny_new"] = api["rlsdk.score_samples"]
    current["rlsdk.unannounced"] = api["rlsdk.score_samples"]
    current["rlsdk.reward_value"] = api["rlsdk.score_samples"]  # other parameters: a break
    del current["rlsdk.Sample"]
    found = api_check.problems(baseline, current, CHANGELOG)
    assert [line.split(":")[0] for line in found] == ["added rlsdk.unannounced", "removed rlsdk.Sample"] + [
        "changed rlsdk.reward_value"
    ] * (len(found) - 2)
    assert len(found) > 2 and all("Parameter was" in f for f in found[2:])
    deprecated = CHANGELOG.replace("`old_name`", "`reward_value`, `Sample`, `unannounced`")
    assert api_check.problems(baseline, current, deprecated) == []


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
    ("rlsdk.engine", "InferenceEngine", "rlsdk.engine_api.InferenceEngine"),
    ("rlsdk.protocol", "EngineRequestError", "rlsdk.engine_api.EngineRequestError"),
    ("rlsdk.rollout.job", "run_job", "rlsdk.run_job"),
    ("rlsdk.engines.server", "start_server", "rlsdk.run.engine_server.start_server"),
    ("rlsdk.plugins.defaults", "pop_first", "rlsdk.rollout.plugin.pop_first"),
    ("rlsdk.training.options", "trainer_world_size", "rlsdk.trainer_api.trainer_world_size"),
    ("rlsdk.training", "PolicyTrainer", "rlsdk.trainer_api.PolicyTrainer"),
    ("rlsdk.engines.engine", "SGLangClient", "rlsdk.engine_api.SGLangClient"),
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
    """What an outside author's package may import, rlsdk's own plugin packages import, in their code and in
    their tests alike: :data:`PUBLIC_MODULES` (and ``rlsdk.slime.<kind>`` adapter paths)."""
    sources = sorted([*(ROOT / "plugins").glob("*/src/**/*.py"), *(ROOT / "plugins").glob("*/tests/**/*.py")])
    assert sources
    internal = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in sources
        for line, module in _rlsdk_imports(path)
        if module not in PUBLIC_MODULES and not module.startswith("rlsdk.slime.")
    ]
    assert not internal, "plugins import rlsdk internals:\n" + "\n".join(internal)


def _taught_imports(text: str) -> list[str]:
    """The rlsdk modules the python code blocks of a Markdown page or a docstring import."""
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S) + re.findall(
        r"\.\. code-block:: python\n\n(.*?)(?:\n\S|\Z)", text, flags=re.S
    )
    return [m for block in blocks for m in re.findall(r"^\s*(?:from|import) (rlsdk[\w.]*)", block, flags=re.M)]


def test_the_docs_the_hooks_and_the_scaffold_teach_only_public_imports(tmp_path):
    """What a plugin author reads (the README, the docs site, each hook's example) and what ``rlsdk plugins
    new`` writes import only :data:`PUBLIC_MODULES`."""
    from rlsdk.plugins.kinds import RECORD_TYPES
    from rlsdk_cli.scaffold import SCAFFOLD_KINDS, scaffold

    taught = {str(path.relative_to(ROOT)): _taught_imports(path.read_text())
              for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
    taught.update({f"rlsdk.{record.__name__}": _taught_imports(record.__doc__ or "") for record in RECORD_TYPES.values()})
    package = scaffold("my-plugin", list(SCAFFOLD_KINDS), tmp_path)
    taught.update({str(path.relative_to(tmp_path)): [m for _, m in _rlsdk_imports(path)] for path in package.rglob("*.py")})
    assert sum(map(len, taught.values())) > 50  # the pages, the hooks and the package do import rlsdk
    internal = {where: sorted({m for m in modules if m not in PUBLIC_MODULES and not m.startswith("rlsdk.slime.")})
                for where, modules in taught.items()}
    assert {where: modules for where, modules in internal.items() if modules} == {}
