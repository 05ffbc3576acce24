"""Folders one process writes at a time: ``flock`` on a ``.rlsdk.lock`` file in the folder, which names its
holder, so a second writer fails at once saying which folder and which process holds it."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import RlsdkError
from .outputs import LOCK_FILE


_HELD: set[Path] = set()
"""Folders this process holds (their insides are its own)."""


@contextmanager
def folder_lock(folder: Path, holder: str = "rlsdk run", role: str = "--output") -> Iterator[None]:
    """Hold ``folder`` (made if missing) for this process, as ``holder`` uses it (``role``: the option
    naming it): a second one fails at once naming the first one's pid and use, and so does one on a folder
    inside a folder another process holds. The lock goes with the process, even a SIGKILLed one."""
    folder.mkdir(parents=True, exist_ok=True)
    check_not_inside_a_held_folder(folder)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    held = folder.resolve()
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RlsdkError(f"{folder} is in use by {describe_holder(os.pread(fd, 512, 0))}: two writers "
                             f"in one folder would overwrite each other's files; wait for it to end or stop "
                             f"it, or choose another {role}") from None  # fmt: skip
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "holder": holder, "role": role}).encode(), 0)
        _HELD.add(held)
        yield
    finally:
        _HELD.discard(held)
        os.close(fd)  # releases the lock


def check_not_inside_a_held_folder(folder: Path) -> None:
    """RlsdkError when a folder above ``folder`` is held by another process (a run's ``--save`` inside
    another run's output folder would overwrite its checkpoints)."""
    for parent in folder.resolve().parents:
        lock = parent / LOCK_FILE
        if parent in _HELD or not lock.is_file():
            continue
        fd = os.open(lock, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RlsdkError(
                    f"{folder} is inside {parent}, which is in use by {describe_holder(os.pread(fd, 512, 0))}: "
                    "its files are that process's to write; choose a folder outside it"
                ) from None
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def read_holder(text: bytes | str) -> dict[str, Any]:
    """What a lock file says of its holder (``pid``, ``holder``, ``role``; an older one holds the pid alone)."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return {"pid": value} if isinstance(value, int) else value if isinstance(value, dict) else {}


def describe_holder(text: bytes) -> str:
    """``another rlsdk run (pid N) as its --save folder`` from a lock file's text."""
    value = read_holder(text)
    pid = value.get("pid", "unknown")
    holder, role = str(value.get("holder", "rlsdk run"))[:100], value.get("role")
    return f"another {holder} (pid {pid})" + (f" as its {str(role)[:100]} folder" if role else "")
