"""Ctrl-C in the middle of ``rlsdk run`` (a real subprocess, the embedded engine on the small model)."""

from __future__ import annotations

import pytest

import signal
import subprocess
import sys
import time

RLSDK = [sys.executable, "-c", "from rlsdk_cli.app import main; main()"]


def ctrl_c_default() -> None:
    """In the child: Ctrl-C as in a terminal, even when pytest itself was started in the background (a
    shell then ignores SIGINT for it, its children inherit that, and Python keeps an ignored SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
def test_ctrl_c_mid_step_leaves_no_flood_of_asyncio_errors(tmp_path):
    """The loop used to be stopped under the step's pending tasks: one "Task was destroyed but it is
    pending!" and "Event loop is closed" traceback per group."""
    proc = subprocess.Popen(
        [*RLSDK, "run", "--output", str(tmp_path / "run"), "--num-rollout", "50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=ctrl_c_default,  # noqa: PLW1509 (one signal call)
    )
    started = time.monotonic()
    seen = []
    while time.monotonic() - started < 120:
        line = proc.stdout.readline()
        seen.append(line)
        if not line or "reading the data" in line:  # the model is loaded; step 0 comes next
            break
    assert seen[-1].startswith("reading the data"), "".join(seen)
    time.sleep(2)  # generating step 0
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130
    assert f"continue with: rlsdk run --resume --output {tmp_path / 'run'}" in output
    for noise in ("Task was destroyed but it is pending", "Event loop is closed", "Exception ignored in"):
        assert noise not in output, "".join(seen) + output
