"""Delta weights on the engine's host (slime's ``--update-weight-mode delta``), the format's one place: each
version folder ``weight_v{N:06d}/`` is a Hugging Face checkpoint folder whose ``model-*.safetensors`` hold each
changed tensor's encoded, zstd-compressed delta as bytes and whose ``model.safetensors.index.json`` carries what
applying needs (encoding, checksum algorithm, the version it applies on, each tensor's dtype, shape and
checksum of its new value). Encodings: ``xor`` writes ``new ^ old`` (smallest; applied exactly once, on its
base), ``overwrite`` the changed byte positions and their new values (idempotent); byte-level, so any dtype.

The host keeps a full local checkpoint, materialized from the base on the first pull, applies each version in
order, checks every tensor written, and the engine reloads it (``update_weights_from_disk``). A version applies
only on the one it names as its base; a checksum that differs raises, so a corrupt delta or a wrong base never
reaches the engine. Imported only where a delta sync runs (numpy, torch, safetensors, zstandard).
"""

from __future__ import annotations

import importlib
import json
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file

ENCODINGS = ("xor", "overwrite")
CHECKSUMS = ("xxh3-128", "blake3", "adler32")
INDEX = "model.safetensors.index.json"
VERSION_FOLDER = "weight_v{:06d}"
ZSTD_LEVEL = 1


def digest(data: np.ndarray, algorithm: str) -> str:
    """The checksum of ``data``'s bytes with ``algorithm`` (:data:`CHECKSUMS`)."""
    view = np.ascontiguousarray(data).data  # no copy
    if algorithm == "adler32":
        return f"{zlib.adler32(view):08x}"
    if algorithm == "xxh3-128":
        import xxhash

        return str(xxhash.xxh3_128_hexdigest(view))
    if algorithm == "blake3":
        try:
            blake3 = importlib.import_module("blake3")  # optional: slime's cryptographic choice
        except ImportError as exc:
            raise ImportError("--update-weight-delta-checksum blake3 needs the blake3 package") from exc
        return str(blake3.blake3(view).hexdigest())
    raise ValueError(f"unknown checksum {algorithm!r}: one of {', '.join(CHECKSUMS)}")


def raw_bytes(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's bytes (uint8, C order), whatever its dtype."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().copy()


def encode(old: np.ndarray, new: np.ndarray, encoding: str) -> bytes:
    """The delta taking bytes ``old`` to ``new`` (same length), compressed."""
    import zstandard

    if encoding == "xor":
        body = np.bitwise_xor(old, new).tobytes()
    elif encoding == "overwrite":
        positions = np.flatnonzero(old != new).astype(np.uint64)
        body = len(positions).to_bytes(8, "little") + positions.tobytes() + new[positions].tobytes()
    else:
        raise ValueError(f"unknown delta encoding {encoding!r}: one of {', '.join(ENCODINGS)}")
    return bytes(zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(body))


def apply_delta(old: np.ndarray, delta: bytes, encoding: str) -> np.ndarray:
    """``old``'s bytes with the (compressed) ``delta`` applied."""
    import zstandard

    body = zstandard.ZstdDecompressor().decompress(delta)
    if encoding == "xor":
        return np.bitwise_xor(old, np.frombuffer(body, dtype=np.uint8))
    if encoding == "overwrite":
        count = int.from_bytes(body[:8], "little")
        positions = np.frombuffer(body, dtype=np.uint64, count=count, offset=8)
        values = np.frombuffer(body, dtype=np.uint8, count=count, offset=8 + 8 * count)
        new = old.copy()
        new[positions] = values
        return new
    raise ValueError(f"unknown delta encoding {encoding!r}: one of {', '.join(ENCODINGS)}")


# ----- the checkpoint files: tensors as bytes --------------------------------------------------------------


def _checkpoint_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} holds no *.safetensors files")
    return files


def read_checkpoint(folder: Path) -> dict[str, tuple[np.ndarray, str, list[int]]]:
    """Every tensor of a Hugging Face checkpoint folder as (bytes, dtype, shape)."""
    from safetensors import safe_open

    tensors = {}
    for file in _checkpoint_files(folder):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                tensor = handle.get_tensor(name)
                tensors[name] = (
                    raw_bytes(tensor),
                    str(tensor.dtype).removeprefix("torch."),
                    list(tensor.shape),
                )
    return tensors


class LocalCheckpoint:
    """A full checkpoint folder on the engine's host, kept at the published version: materialized from
    ``base`` (its safetensors, config and tokenizer files) on the first pull, then patched in place."""

    STATE = "delta_version.json"

    def __init__(self, folder: Path, base: Path) -> None:
        self.folder, self.base = folder, base

    @property
    def version(self) -> int:
        state = self.folder / self.STATE
        return json.loads(state.read_text())["version"] if state.exists() else -1

    def materialize(self) -> None:
        """The base's files, copied, as version 0 (once)."""
        if self.version >= 0:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        for file in self.base.iterdir():
            if file.is_file():
                shutil.copy2(file, self.folder / file.name)
        (self.folder / self.STATE).write_text(json.dumps({"version": 0}))

    def pull(self, published: Path, version: int) -> None:
        """Bring the folder to ``version``, applying each version after its own in order; every tensor
        written is checked against the publisher's checksum (a mismatch raises and the folder keeps what it
        had)."""
        self.materialize()
        for next_version in range(self.version + 1, version + 1):
            self._apply(published / VERSION_FOLDER.format(next_version))

    def _apply(self, folder: Path) -> None:
        index = json.loads((folder / INDEX).read_text())
        meta = index["metadata"]["delta"]
        if meta["base_version"] != self.version:
            raise ValueError(
                f"{folder.name} applies on version {meta['base_version']}; {self.folder} is at {self.version}"
            )
        deltas: dict[str, np.ndarray] = {}
        for file in sorted(set(index["weight_map"].values())):
            deltas.update(load_file(str(folder / file)))
        from safetensors.torch import load_file as load_torch, save_file as save_torch

        for file in _checkpoint_files(self.folder):
            tensors = load_torch(str(file))
            changed = [name for name in tensors if name in deltas]
            for name in changed:
                entry = meta["tensors"][name]
                old = raw_bytes(tensors[name])
                new = apply_delta(old, deltas[name].tobytes(), meta["encoding"])
                if digest(new, meta["checksum"]) != entry["checksum"]:
                    raise ValueError(
                        f"{folder.name}: {name} does not match its checksum after the delta: a corrupt delta "
                        f"or a wrong base in {self.folder}"
                    )
                dtype = getattr(torch, entry["dtype"])
                tensors[name] = torch.from_numpy(new).view(dtype).reshape(entry["shape"])
            if changed:
                save_torch(tensors, str(file), metadata={"format": "pt"})
        missing = sorted(set(deltas) - {n for f in _checkpoint_files(self.folder) for n in _names(f)})
        if missing:
            raise ValueError(f"{folder.name} changes tensors {self.folder} lacks: {missing[:3]}")
        (self.folder / self.STATE).write_text(json.dumps({"version": meta["version"]}))


def _names(file: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as handle:
        return list(handle.keys())


@dataclass(frozen=True)
class DeltaPull:
    """What an engine's host needs to bring its local checkpoint to ``version``: the publish folder, the local
    folder and the base it starts from (paths on that host)."""

    published: str
    version: int
    local: str
    base: str

    def apply(self) -> None:
        LocalCheckpoint(Path(self.local), Path(self.base)).pull(Path(self.published), self.version)
