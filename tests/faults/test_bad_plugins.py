"""Installed plugins that misbehave, against the real ``rlsdk`` command in a subprocess: one that calls
``sys.exit()`` at import, one whose hook raises, one that fails in strict mode."""

from __future__ import annotations

import pytest

import os
import subprocess

from .conftest import RLSDK, rlsdk_run, run_options

EXITS = "import sys\nsys.exit(0)\n"
HOOK_RAISES = """
from rlsdk import hookimpl

@hookimpl
def rlsdk_rewards():
    raise RuntimeError("needs a GPU")
"""


def rlsdk(site, *args, **env):
    pythonpath = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [*RLSDK, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": pythonpath, **env},
    )


@pytest.mark.plugins("rlsdk_rm_hub")
def test_sys_exit_at_import_and_a_raising_hook_do_not_take_commands_down(fake_dist):
    """``sys.exit(0)`` at import used to end every command silently with success; a raising hook broke
    every command, even ones that never use its kind."""
    fake_dist("rl-plugin-exits", "0.1.0", "exits", "rl_plugin_exits", EXITS)
    site = fake_dist("rl-plugin-gpu", "0.2.0", "gpu", "rl_plugin_gpu", HOOK_RAISES)
    listed = rlsdk(site, "plugins", "list")
    assert listed.returncode == 0, listed.stderr
    assert "rlsdk_rm_hub" in listed.stdout or "rm_hub" in listed.stdout
    everything = listed.stdout + listed.stderr
    assert "exits" in everything and "SystemExit(0)" in everything
    assert "needs a GPU" in everything


def test_strict_mode_failure_is_one_line_not_a_traceback(fake_dist):
    site = fake_dist("rl-plugin-gpu", "0.2.0", "gpu", "rl_plugin_gpu", HOOK_RAISES)
    strict = rlsdk(site, "plugins", "list", RLSDK_STRICT_PLUGINS="1")
    assert strict.returncode == 1
    assert "Traceback" not in strict.stderr, strict.stderr
    assert (
        strict.stderr.startswith("Error: plugin 'gpu' from rl-plugin-gpu 0.2.0")
        and "needs a GPU" in strict.stderr
    )


def test_a_plugin_file_calling_sys_exit_at_import_stops_rlsdk_run_with_an_error(
    misbehaving_engine, word_tokenizer, data, tmp_path
):
    """``--rm-type exits.py:fn`` whose module calls ``sys.exit(0)`` at import used to end ``rlsdk run``
    with exit code 0 and nothing said."""
    exits = tmp_path / "exits.py"
    exits.write_text(EXITS + "def fn(args, sample, **kw):\n    return 1.0\n")
    options = run_options(misbehaving_engine.url, word_tokenizer, data, tmp_path / "out")
    done = rlsdk_run(*options, "--rm-type", f"{exits}:fn")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "SystemExit(0)" in output and "exits.py" in output and "Traceback" not in output, output
