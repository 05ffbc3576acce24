"""``rlsdk plugins new``: the generated package passes its own tests, installs with pip, and shows up in
``rlsdk plugins list``."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlsdk_cli.app import app
from rlsdk_cli.scaffold import SCAFFOLD_KINDS

runner = CliRunner()


def new_plugin(tmp_path: Path, *kinds: str, name: str = "my-rewards") -> Path:
    options = [arg for kind in kinds for arg in ("--kind", kind)]
    result = runner.invoke(app, ["plugins", "new", name, "--dir", str(tmp_path), *options])
    assert result.exit_code == 0, result.output
    return tmp_path / name


def test_a_new_plugin_passes_its_own_tests_installs_and_is_listed(tmp_path, pip_install):
    trainer_hooks = {
        "megatron_init",
        "megatron_before_log_prob",
        "megatron_before_train_step",
        "model_provider",
    }
    assert trainer_hooks | {"task_generator", "update_weight_post_write"} <= set(SCAFFOLD_KINDS)
    root = new_plugin(tmp_path, *SCAFFOLD_KINDS)
    assert (root / "README.md").exists()
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    # run as the README says, from the folder that also holds the clone: `python -m pytest` puts that folder
    # first on sys.path, where the clone (a folder named rlsdk) must not shadow the installed package
    (tmp_path / "rlsdk" / "core").mkdir(parents=True)
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", root.name],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert tests.returncode == 0 and f"{len(SCAFFOLD_KINDS)} passed" in tests.stdout, (
        tests.stdout + tests.stderr
    )

    site = pip_install(root)  # a real pip install, into a folder of its own put on the path below
    listed = subprocess.run(
        [sys.executable, "-m", "rlsdk_cli.app", "plugins", "list", "--json"],
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    [row] = [r for r in json.loads(listed.stdout) if r["distribution"] == "my-rewards"]
    assert row["entry_point"] == "my_rewards" and row["version"] == "0.1.0"
    assert "my_rewards_exact_match" in row["provides"]["reward"]  # with the environment's rubric parts
    assert set(row["provides"]) == set(SCAFFOLD_KINDS)


def test_plugins_declare_rlsdk_without_an_upper_bound(tmp_path):
    """A moved name keeps working for a minor version, so a cap at the next minor would orphan a plugin that
    still runs: the scaffold and the bundled plugins declare a floor only (docs/api.md says so)."""
    import tomllib

    from rlsdk import __version__

    root = new_plugin(tmp_path)
    floor = ".".join(__version__.split(".")[:2])
    assert tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"] == [f"rlsdk>={floor}"]
    repository = Path(__file__).resolve().parents[1]
    for pyproject in sorted((repository / "plugins").glob("*/pyproject.toml")):
        for requirement in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
            if requirement.startswith("rlsdk"):
                assert "<" not in requirement, f"{pyproject}: {requirement}"
    assert 'dependencies = ["rlsdk>=0.2"]' in (repository / "docs" / "api.md").read_text()


@pytest.fixture(scope="module")
def kinds_alone(tmp_path_factory) -> dict[str, str]:
    """A package of each kind alone, and their tests run in one pytest process (one interpreter for all 33,
    ``-p rlsdk.testing`` doing what each package's conftest does): kind -> "passed" or the failure."""
    import xml.etree.ElementTree as ET

    root = tmp_path_factory.mktemp("kinds")
    packages = {kind: new_plugin(root, kind, name=f"only-{kind.replace('_', '-')}") for kind in SCAFFOLD_KINDS}
    report = root / "report.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p / "src") for p in packages.values())}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "rlsdk.testing", "--noconftest",
               "--import-mode=importlib", f"--junitxml={report}", "-o", "junit_family=xunit1", f"--rootdir={root}",
               *[p.name for p in packages.values()]]
    subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False)
    outcomes: dict[str, str] = {}
    for case in ET.parse(report).iter("testcase"):
        kind = Path(case.get("file", "")).parts[0].removeprefix("only-").replace("-", "_")
        problem = next(iter(case), None)
        if outcomes.get(kind, "passed") == "passed":
            outcomes[kind] = "passed" if problem is None else f"{problem.tag}: {problem.get('message')}"
    return outcomes


@pytest.mark.parametrize("kind", SCAFFOLD_KINDS)
def test_a_package_of_one_kind_passes_its_own_tests(kinds_alone, kind):
    """Each kind alone (its imports, its example, its test: the kind's check in rlsdk.testing where it has one)."""
    assert kinds_alone.get(kind) == "passed", kinds_alone.get(kind, f"no test ran for {kind}: {kinds_alone}")


def test_the_default_is_one_reward(tmp_path):
    root = new_plugin(tmp_path)
    plugin = (root / "src" / "my_rewards" / "plugin.py").read_text()
    assert "def rlsdk_rewards" in plugin and "rlsdk_dynamic_filters" not in plugin
    assert "check_reward" in (root / "tests" / "test_plugin.py").read_text()


@pytest.mark.parametrize(
    ("name", "kinds", "message"),
    [
        ("9lives", [], "cannot name a Python package"),
        ("class", [], "cannot name a Python package"),
        ("ok-name", ["rewards"], "unknown kind(s) rewards"),
    ],
)
def test_bad_names_and_kinds_are_refused(tmp_path, name, kinds, message):
    options = [arg for kind in kinds for arg in ("--kind", kind)]
    result = runner.invoke(app, ["plugins", "new", name, "--dir", str(tmp_path), *options])
    assert result.exit_code == 2 and message in result.output
    assert not any(tmp_path.iterdir())


def test_an_existing_folder_is_never_overwritten(tmp_path):
    (tmp_path / "my-rewards").mkdir()
    (tmp_path / "my-rewards" / "keep.txt").write_text("mine")
    result = runner.invoke(app, ["plugins", "new", "my-rewards", "--dir", str(tmp_path)])
    assert result.exit_code == 2 and "already exists" in result.output
    assert [p.name for p in (tmp_path / "my-rewards").iterdir()] == ["keep.txt"]
