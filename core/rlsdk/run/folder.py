"""What keeps one run's output folder one run's: a lock held while a run uses it (T20), and the data
file's fingerprint, so a file changed in place is noticed on ``--resume`` (T16)."""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import RlsdkError
from ..outputs import LOCK_FILE


@contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Hold ``folder`` for this process (``flock`` on ``.rlsdk.lock``, which holds the pid): a second run
    on it fails at once naming the first one's pid. The lock goes with the process, even a SIGKILLed one."""
    path = folder / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise RlsdkError(
                f"{folder} is in use by another rlsdk run (pid {holder}): two runs on one folder would "
                "write the same steps twice; wait for it to end or stop it, or choose another --output"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def data_fingerprint(path: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """Size, modification time and SHA-256 of the data file (None without one)."""
    if not path or not Path(path).is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    stat = Path(path).stat()
    return {
        "path": str(path),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": digest.hexdigest(),
    }


def check_data_unchanged(saved: dict[str, Any] | None, now: dict[str, Any] | None) -> None:
    """Resuming on a data file whose contents changed would serve other rows at the saved positions."""
    if not saved or not now or saved.get("sha256") == now.get("sha256"):
        return
    raise RlsdkError(
        f"--resume: the data file {now['path']} changed since the run was saved (size {saved.get('size')} -> "
        f"{now['size']} bytes, contents differ): the saved data position would point at other rows; "
        "restore the file, or start a new run (--overwrite)"
    )
