"""Real services for the fault and attacker suites: ``rlsdk buffer serve`` in a subprocess on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

BUFFER_CLI = [
    sys.executable,
    "-c",
    "from rlsdk_cli.app import main; main()",
    "buffer",
    "serve",
    "--port",
    "0",
]


class BufferProcess:
    """``rlsdk buffer serve`` running in a subprocess; ``url`` once it listens, ``kill()`` is SIGKILL."""

    def __init__(self, data_dir: os.PathLike[str], *options: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [*BUFFER_CLI, "--data-dir", str(data_dir), *options],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line.startswith("rollout buffer on "):
            raise AssertionError(line + self.proc.stderr.read())  # type: ignore[union-attr]
        self.url = line.split()[3]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def buffer_service(tmp_path) -> Iterator:
    """``buffer_service(*options, data_dir=..., env=...)`` starts one; all are killed at the end."""
    started: list[BufferProcess] = []

    def start(
        *options: str, data_dir: os.PathLike[str] | None = None, env: dict[str, str] | None = None
    ) -> BufferProcess:
        started.append(BufferProcess(data_dir or tmp_path / "buffer", *options, env=env))
        return started[-1]

    yield start
    for service in started:
        service.kill()
