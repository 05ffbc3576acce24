"""A server process in a process group of its own, its output in a log file, that never outlives rlsdk.

The child starts a new session (so one ``killpg`` reaches the workers it forks) and asks the kernel to
send it SIGTERM when rlsdk dies (``PR_SET_PDEATHSIG``), so even a ``kill -9`` of rlsdk leaves no server
holding a GPU (the signal follows the *thread* that started it: start servers from a long-lived one, such
as the run's event-loop thread). :meth:`ManagedProcess.stop` sends SIGTERM to the group, waits, then SIGKILLs what is left;
every process still running when the interpreter exits is stopped by an ``atexit`` hook.
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..protocol import EngineUnavailableError

if TYPE_CHECKING:
    import aiohttp

_RUNNING: weakref.WeakSet[ManagedProcess] = weakref.WeakSet()
_PR_SET_PDEATHSIG = 1


_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
"""Resolved here, so the child runs no dynamic loading between fork and exec."""


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ManagedProcess:
    """``command`` started in its own process group with stdout and stderr appended to ``log_path``."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> None:
        self.name = name
        self.command = list(command)
        self.log_path = Path(log_path)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.cwd is not None:
            Path(self.cwd).mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(self.command)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 (one pre-resolved prctl call)
            )
        _RUNNING.add(self)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def exit_code(self) -> int | None:
        """The exit status once the process ended; None while it runs (or before :meth:`start`)."""
        return self.process.poll() if self.process is not None else None

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the log, for error messages."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 16384))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    async def wait_answering(
        self,
        session: aiohttp.ClientSession,
        url: str,
        *,
        timeout: float,
        option: str,
        exited: type[Exception],
        ready: Callable[[aiohttp.ClientResponse], Awaitable[bool]] | None = None,
        waiting_for: str | None = None,
    ) -> None:
        """Until this server answers ``url`` with 200 (or ``ready`` of its answer holds), asked every half
        second through ``session``. Raises ``exited`` when the process exits first, and
        :class:`~rlsdk.engine_api.EngineUnavailableError` after ``timeout`` seconds, naming ``option`` (the
        setting of that timeout) and ``waiting_for`` (default: ``answer URL``); both show the log's tail."""
        import aiohttp  # loaded where a server is launched, not where this module is imported

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            code = self.exit_code()
            if code is not None:
                raise exited(
                    f"{self.name} exited with status {code} while starting; log: {self.log_path}\n{self.log_tail()}"
                )
            try:
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=30)) as response:
                    if await ready(response) if ready else response.status == 200:
                        return
            except (TimeoutError, aiohttp.ClientError):
                pass
            if loop.time() > deadline:
                raise EngineUnavailableError(
                    f"{self.name} did not {waiting_for or f'answer {url}'} within {timeout:.0f}s ({option}); "
                    f"log: {self.log_path}\n{self.log_tail()}"
                )
            await asyncio.sleep(0.5)

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to the whole process group, SIGKILL to what is left after ``grace`` seconds."""
        if self.process is None:
            return
        _RUNNING.discard(self)
        pgid = self.process.pid  # setsid made the child its group's leader
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            self.process.poll()  # reap the leader, or the group never empties
            if not _group_alive(pgid):
                break
            time.sleep(0.05)
        _signal_group(pgid, signal.SIGKILL)
        self.process.wait()
        self.process = None


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs. Zombies do not count: a worker orphaned by a SIGKILLed
    server is adopted by a process that may reap it only much later (Ray's raylet, say), and an exited
    process holds no GPU and no port."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _has_live_member(pgid)


def _has_live_member(pgid: int) -> bool:
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():  # no procfs: take killpg's word
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # ended meanwhile
            continue
        state, _ppid, group = text[text.rindex(")") + 2 :].split()[:3]
        if int(group) == pgid and state != "Z":
            return True
    return False


@atexit.register
def _stop_all() -> None:
    for process in list(_RUNNING):
        process.stop(grace=5.0)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (for a server about to start)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
