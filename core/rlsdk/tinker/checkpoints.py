"""``tinker://`` paths and the server's checkpoint folder.

``tinker://<training run id>/weights/<name>`` (a training state: weights, optimizer, random state),
``tinker://<run>/sampler_weights/<name>`` (weights for sampling) and ``tinker://<run>/external_weights/<name>``
(a merged Hugging Face folder) map to ``<root>/<run>/<kind>/<name>/``, each with a ``checkpoint.json`` of its
metadata; every training run has a ``<root>/<run>/run.json``. Only names the server made are accepted: a path
that steps outside the root, or names anything but these three kinds, is refused.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .futures import UserError

KINDS = {"weights": "training", "sampler_weights": "sampler", "external_weights": "external"}
"""Path segment -> the SDK's ``checkpoint_type``."""
META = "checkpoint.json"
RUN_META = "run.json"
_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{8,64}:train:\d{1,9}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MIN_TTL, MAX_TTL = 3600, 10 * 365 * 24 * 3600


def check_name(name: str, what: str = "name") -> str:
    """A checkpoint name: letters, digits, ``.``, ``_``, ``-`` (no path separators, not ``.``/``..``)."""
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
        raise UserError(
            f"{what} {str(name)[:80]!r}: a checkpoint name is 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def check_ttl(ttl_seconds: int | None) -> int | None:
    if ttl_seconds is not None and not MIN_TTL <= ttl_seconds <= MAX_TTL:
        raise UserError(f"ttl_seconds {ttl_seconds}: between {MIN_TTL} (an hour) and {MAX_TTL} (ten years)")
    return ttl_seconds


@dataclass(frozen=True)
class CheckpointPath:
    run_id: str
    segment: str
    name: str

    @property
    def tinker_path(self) -> str:
        return f"tinker://{self.run_id}/{self.segment}/{self.name}"

    @property
    def checkpoint_id(self) -> str:
        return f"{self.segment}/{self.name}"

    @property
    def kind(self) -> str:
        return KINDS[self.segment]

    @classmethod
    def parse(cls, path: str) -> CheckpointPath:
        if not isinstance(path, str) or not path.startswith("tinker://"):
            raise UserError(f"path {str(path)[:120]!r}: a tinker:// path (tinker://<run>/weights/<name>)")
        parts = path.removeprefix("tinker://").split("/")
        if len(parts) != 3 or not _RUN_ID.match(parts[0]) or parts[1] not in KINDS:
            raise UserError(
                f"path {path[:120]!r}: expected tinker://<training run id>/{'|'.join(KINDS)}/<name>"
            )
        return cls(parts[0], parts[1], check_name(parts[2]))


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise UserError(f"training run id {str(run_id)[:80]!r} is not one this server issues")
    return run_id


def _iso(seconds: float | None) -> str | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC).isoformat()


class CheckpointStore:
    """The checkpoint folder: where each path lives, its metadata, listing, deleting and expiry."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def folder(self, path: CheckpointPath) -> Path:
        folder = (self.root / path.run_id / path.segment / path.name).resolve()
        if self.root not in folder.parents:  # the patterns already rule this out; a second lock
            raise UserError(f"{path.tinker_path} is outside the checkpoint folder")
        return folder

    def run_folder(self, run_id: str) -> Path:
        return self.root / check_run_id(run_id)

    # ------------------------------------------------------------------ training runs

    def write_run(self, run_id: str, meta: dict[str, Any]) -> None:
        folder = self.run_folder(run_id)
        folder.mkdir(parents=True, exist_ok=True)
        _write_json(folder / RUN_META, meta)

    def read_run(self, run_id: str) -> dict[str, Any] | None:
        try:
            meta = json.loads((self.run_folder(run_id) / RUN_META).read_text())
        except (OSError, ValueError):
            return None
        return meta if isinstance(meta, dict) else None

    def runs(self) -> list[tuple[str, dict[str, Any]]]:
        found = []
        for folder in sorted(self.root.iterdir(), key=lambda f: f.stat().st_mtime):
            if _RUN_ID.match(folder.name) and (meta := self.read_run(folder.name)) is not None:
                found.append((folder.name, meta))
        return found

    # ------------------------------------------------------------------ checkpoints

    def begin(self, path: CheckpointPath, overwrite: bool) -> Path:
        """A fresh staging folder for ``path``; an existing checkpoint of that name is an error unless
        ``overwrite``."""
        folder = self.folder(path)
        if folder.exists() and not overwrite:
            raise UserError(f"{path.tinker_path} exists; pass overwrite=True to replace it")
        staging = folder.with_name(f".{folder.name}.staging")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        return staging

    def commit(self, path: CheckpointPath, staging: Path, meta: dict[str, Any]) -> None:
        """Publish a staged checkpoint under ``path`` with its metadata (replacing one of the same name)."""
        _write_json(staging / META, {**meta, "created": time.time()})
        folder = self.folder(path)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(staging, folder)

    def meta(self, path: CheckpointPath) -> dict[str, Any] | None:
        try:
            meta = json.loads((self.folder(path) / META).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict) or _expired(meta):
            return None
        return meta

    def update(self, path: CheckpointPath, **changes: Any) -> None:
        meta = self.meta(path)
        if meta is None:
            raise FileNotFoundError(path.tinker_path)
        _write_json(self.folder(path) / META, {**meta, **changes})

    def delete(self, path: CheckpointPath) -> None:
        folder = self.folder(path)
        if not (folder / META).is_file():
            raise FileNotFoundError(path.tinker_path)
        shutil.rmtree(folder)

    def listing(self, run_id: str) -> list[tuple[CheckpointPath, dict[str, Any]]]:
        """Every live checkpoint of a run, oldest first."""
        found = []
        for segment in KINDS:
            base = self.run_folder(run_id) / segment
            if not base.is_dir():
                continue
            for folder in base.iterdir():
                if folder.name.startswith(".") or not _NAME.match(folder.name):
                    continue
                path = CheckpointPath(run_id, segment, folder.name)
                if (meta := self.meta(path)) is not None:
                    found.append((path, meta))
        return sorted(found, key=lambda item: item[1].get("created", 0.0))

    def describe(self, path: CheckpointPath, meta: dict[str, Any]) -> dict[str, Any]:
        """The SDK's ``Checkpoint`` fields."""
        folder = self.folder(path)
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        return {
            "checkpoint_id": path.checkpoint_id,
            "checkpoint_type": path.kind,
            "time": _iso(meta.get("created")),
            "tinker_path": path.tinker_path,
            "size_bytes": size,
            "public": bool(meta.get("public")),
            "user_metadata": meta.get("user_metadata"),
            "expires_at": _iso(meta.get("expires_at")),
        }

    def remove_expired(self) -> int:
        """Delete checkpoints past their TTL; how many."""
        removed = 0
        for run_id, _ in self.runs():
            for segment in KINDS:
                base = self.run_folder(run_id) / segment
                for folder in base.iterdir() if base.is_dir() else []:
                    try:
                        meta = json.loads((folder / META).read_text())
                    except (OSError, ValueError):
                        continue
                    if isinstance(meta, dict) and _expired(meta):
                        shutil.rmtree(folder, ignore_errors=True)
                        removed += 1
        return removed


def _expired(meta: dict[str, Any]) -> bool:
    expires = meta.get("expires_at")
    return isinstance(expires, int | float) and expires <= time.time()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(temporary, path)
