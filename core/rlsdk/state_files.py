"""Reading the files a run saved (``state.json``, checkpoint metadata) as untrusted input: one that is
damaged is an error naming it, never a bare ``JSONDecodeError``/``KeyError`` traceback; a state is signed
with this machine's key, so a state another machine wrote (or anyone edited) is told from one rlsdk wrote
here; and files are fingerprinted (SHA-256), so a checkpoint part changed since it was saved is noticed."""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .errors import CheckpointError

SIGNATURE = "signature"
"""Key of a signed state: HMAC-SHA256 of the rest, with this machine's key."""
KEY_FILE = "state-signing.key"


def read_json(path: Path, *keys: str) -> dict[str, Any]:
    """The JSON object in ``path``, which must hold ``keys``; :class:`CheckpointError` naming the file
    otherwise."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(
            f"{path} cannot be read ({type(exc).__name__}: {exc}); is it damaged?"
        ) from None
    missing = [key for key in keys if key not in value] if isinstance(value, dict) else list(keys)
    if not isinstance(value, dict) or missing:
        raise CheckpointError(
            f"{path} is damaged or not written by rlsdk: no {', '.join(missing) or 'object'}"
        )
    return value


# ----- this machine's signature --------------------------------------------------------------------------


def key_folder() -> Path:
    """Where this machine's signing key lives: ``$XDG_STATE_HOME/rlsdk`` (``~/.local/state/rlsdk``)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "rlsdk"


@functools.cache
def _key(folder: Path) -> bytes | None:
    path = folder / KEY_FILE
    try:
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = folder / f".{KEY_FILE}.{os.getpid()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(secrets.token_bytes(32))
            try:
                os.link(tmp, path)  # atomic: of two processes making one at once, both take the first
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        key = path.read_bytes()
    except OSError:
        return None  # no writable home: states are not signed, and resume says so
    return key if len(key) == 32 else None


def signing_key() -> bytes | None:
    """This machine's key (made on first use, readable by its owner only); None where none can be kept."""
    return _key(key_folder())


def _digest(key: bytes, value: dict[str, Any]) -> str:
    body = {k: v for k, v in value.items() if k != SIGNATURE}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def signed(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` as JSON data with this machine's signature (unsigned where there is no key)."""
    data = json.loads(json.dumps({k: v for k, v in value.items() if k != SIGNATURE}, default=str))
    key = signing_key()
    if key is not None:
        data[SIGNATURE] = _digest(key, data)
    return data


def signed_here(value: dict[str, Any]) -> bool:
    """Whether rlsdk on this machine (this user) wrote ``value`` as it is: its signature checks."""
    key, signature = signing_key(), value.get(SIGNATURE)
    return (
        key is not None and isinstance(signature, str) and hmac.compare_digest(signature, _digest(key, value))
    )


def strings_in(value: Any) -> Iterable[str]:
    """Every string inside ``value`` (keys and values of nested dicts and lists)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


# ----- fingerprints ---------------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def folder_fingerprints(folder: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {"size", "sha256"}}`` of every file under ``folder`` (hashed in parallel threads:
    hashlib lets go of the GIL)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        digests = list(pool.map(sha256_file, files))
    return {
        p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": d}
        for p, d in zip(files, digests, strict=True)
    }


def check_fingerprints(folder: Path, saved: Any, what: str) -> None:
    """The files under ``folder`` are exactly those ``saved`` (:func:`folder_fingerprints`) records, each
    unchanged; :class:`CheckpointError` naming the first that is not."""
    if not isinstance(saved, dict):
        raise CheckpointError(f"{what}: the recorded fingerprints of {folder} are damaged")
    now = folder_fingerprints(folder)
    extra = sorted(set(now) - set(saved))
    if extra:
        raise CheckpointError(
            f"{what}: {folder / extra[0]} was not written with the checkpoint (not in its fingerprints): "
            "files added to a checkpoint are not loaded"
        )
    for name, recorded in sorted(saved.items()):
        if name not in now:
            raise CheckpointError(f"{what}: {folder / name} is missing (it was saved with the checkpoint)")
        if now[name] != recorded:
            raise CheckpointError(
                f"{what}: {folder / name} changed since it was saved (SHA-256 differs): another run or a "
                "person wrote it; resume from another checkpoint or start afresh"
            )
