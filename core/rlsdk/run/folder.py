"""What keeps one run's folders one run's: a lock held while a run uses them (T20; :mod:`rlsdk.locks`),
and the fingerprints of the data file and of a LoRA run's base model, so a file changed in place is noticed
on ``--resume`` (T16)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from ..errors import RlsdkError
from ..locks import folder_lock
from ..state_files import sha256_file

__all__ = [
    "check_base_model_unchanged",
    "check_data_unchanged",
    "data_fingerprint",
    "folder_lock",
    "model_fingerprint",
]


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


MODEL_FILES = ("*.safetensors", "*.bin", "*.pt", "*.gguf", "*.json")
"""The files of a model folder that make its weights and config (its tokenizer's JSON files too)."""


def model_fingerprint(folder: Path | None) -> dict[str, Any] | None:
    """The path and each weight and config file's size and SHA-256 of a model folder (None without one)."""
    if folder is None or not folder.is_dir():
        return None
    files = sorted({p for pattern in MODEL_FILES for p in folder.glob(pattern) if p.is_file()})
    return {
        "path": str(folder),
        "files": {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in files},
    }


def check_base_model_unchanged(saved: Any, now: dict[str, Any] | None) -> None:
    """A LoRA checkpoint holds the adapter only: on a base model changed since, it would train on and
    serve other weights than it was trained with."""
    if not isinstance(saved, dict) or not now or saved.get("files") == now["files"]:
        return
    files = saved.get("files")
    old: dict[str, Any] = files if isinstance(files, dict) else {}
    changed = sorted(n for n in set(old) | set(now["files"]) if old.get(n) != now["files"].get(n))
    raise RlsdkError(
        f"--resume: the base model {now['path']} changed since the run was saved ({', '.join(changed[:5])} "
        "differ): the checkpoint's LoRA adapter was trained on the other weights; restore the model, or "
        "start a new run (--overwrite)"
    )
