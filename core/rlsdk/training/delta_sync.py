"""Delta weight sync over disk (slime's ``--update-weight-mode delta --update-weight-transport disk``): each sync
ships only the bytes that changed since the last one.

The trainer keeps a CPU snapshot of every tensor, seeded from the base checkpoint the engines started from
(``hf_checkpoint``: the engine's actual weights, whatever the trainer's own round trip would give). Each sync
diffs the trainer's tensors against it and publishes version ``weight_v{N:06d}/`` under the publish folder
(``update_weight_disk_dir``, shared with the engines' hosts): a Hugging Face checkpoint folder whose
``model-*.safetensors`` hold each changed tensor's encoded, zstd-compressed delta as bytes, and whose
``model.safetensors.index.json`` carries what applying needs (encoding, checksum algorithm, the version it
applies on, and each tensor's dtype, shape and checksum of its new value). Encodings: ``xor`` writes
``new ^ old`` (smallest; applied exactly once, on its base), ``overwrite`` the changed byte positions and their
new values (idempotent). Dtype-blind and byte-level, so any dtype works.

The engine's host keeps a full local checkpoint (``update_weight_local_checkpoint_dir``), materialized from the
base on the first pull, and applies each version in order, checking every tensor's checksum, then the engine
reloads it through ``update_weights_from_disk``. A version applies only on the one it names as its base; a
checksum that differs raises, so a corrupt delta or a wrong base never reaches the engine.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import shutil
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

from ..engines.engine import InferenceEngine
from .sync import PostWrite, WeightSync
from .trainer import PolicyTrainer

ENCODINGS = ("xor", "overwrite")
CHECKSUMS = ("xxh3-128", "blake3", "adler32")
INDEX = "model.safetensors.index.json"
VERSION_FOLDER = "weight_v{:06d}"
ZSTD_LEVEL = 1
FILE_BYTES = 2 << 30
"""Encoded bytes per ``model-*.safetensors`` file of a version, at most (one tensor may exceed it)."""


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


# ----- the trainer's side: publish a version ---------------------------------------------------------------


class DeltaPublisher:
    """Publishes each sync's changed tensors as a version folder under ``folder``, diffed against a snapshot
    seeded from the base checkpoint ``base``."""

    def __init__(self, folder: Path, base: Path, encoding: str = "xor", checksum: str = "xxh3-128") -> None:
        if encoding not in ENCODINGS:
            raise ValueError(
                f"update_weight_delta_encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}"
            )
        if checksum not in CHECKSUMS:
            raise ValueError(
                f"update_weight_delta_checksum must be one of {', '.join(CHECKSUMS)}, got {checksum!r}"
            )
        self.folder, self.base, self.encoding, self.checksum = folder, base, encoding, checksum
        self.snapshot: dict[str, np.ndarray] | None = None
        self.dtypes: dict[str, torch.dtype] = {}
        self.version = 0
        """The last version published (0: the base)."""

    def _in_base(self, weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``weights`` by the base checkpoint's names: a tensor the checkpoint leaves out because it shares its
        storage with one it holds (tied embeddings) is skipped; any other one it lacks is an error."""
        assert self.snapshot is not None
        held = {weights[name].data_ptr() for name in weights if name in self.snapshot}
        unknown = sorted(n for n in weights if n not in self.snapshot and weights[n].data_ptr() not in held)
        if unknown:
            raise ValueError(
                f"the trainer has tensors the base checkpoint {self.base} lacks ({unknown[:3]}): a delta sync "
                "needs the engines' starting checkpoint as its base (--hf-checkpoint)"
            )
        missing = sorted(set(self.snapshot) - set(weights))
        if missing:
            raise ValueError(f"the trainer lacks tensors of the base checkpoint {self.base}: {missing[:3]}")
        return {name: tensor for name, tensor in weights.items() if name in self.snapshot}

    def publish(self, weights: Mapping[str, torch.Tensor]) -> tuple[Path, dict[str, int]]:
        """Version ``self.version + 1``: the tensors of ``weights`` that differ from the snapshot, each in the
        base checkpoint's dtype. Returns its folder and its sizes (``tensors`` changed, ``bytes`` written,
        ``raw_bytes`` of the tensors)."""
        if self.snapshot is None:
            base = read_checkpoint(self.base)
            self.snapshot = {name: data for name, (data, _, _) in base.items()}
            self.dtypes = {name: getattr(torch, dtype) for name, (_, dtype, _) in base.items()}
        weights = self._in_base(weights)
        version = self.version + 1
        target = self.folder / VERSION_FOLDER.format(version)
        staging = target.with_name(target.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        entries: dict[str, dict[str, Any]] = {}
        files: list[dict[str, np.ndarray]] = [{}]
        sizes = {"tensors": 0, "bytes": 0, "raw_bytes": 0}
        for name, tensor in weights.items():
            tensor = tensor.detach().to(self.dtypes[name])  # the dtype the engine loads from the checkpoint
            new = raw_bytes(tensor)
            old = self.snapshot[name]
            if len(new) != len(old):
                raise ValueError(
                    f"{name}: {len(new)} bytes, the snapshot's {len(old)}: its shape or dtype changed"
                )
            sizes["raw_bytes"] += len(new)
            if np.array_equal(old, new):
                continue
            delta = np.frombuffer(encode(old, new, self.encoding), dtype=np.uint8)
            if files[-1] and sum(v.nbytes for v in files[-1].values()) + delta.nbytes > FILE_BYTES:
                files.append({})
            files[-1][name] = delta
            entries[name] = {
                "dtype": str(tensor.dtype).removeprefix("torch."),
                "shape": list(tensor.shape),
                "checksum": digest(new, self.checksum),
            }
            self.snapshot[name] = new
            sizes["tensors"] += 1
            sizes["bytes"] += delta.nbytes
        weight_map = {}
        for i, tensors in enumerate(files, 1):
            file = f"model-{i:05d}-of-{len(files):05d}.safetensors"
            save_file(tensors, str(staging / file))
            weight_map.update(dict.fromkeys(tensors, file))
        index = {
            "metadata": {
                "delta": {
                    "version": version,
                    "base_version": self.version,
                    "encoding": self.encoding,
                    "checksum": self.checksum,
                    "compression": "zstd",
                    "tensors": entries,
                }
            },
            "weight_map": weight_map,
        }
        (staging / INDEX).write_text(json.dumps(index))
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        self.version = version
        return target, sizes


# ----- the engine host's side: apply versions to a local checkpoint ----------------------------------------


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


class DeltaDiskSync(WeightSync):
    """Delta sync to an engine on this host: publish the version, apply it to the local checkpoint, and have
    the engine reload that (``update_weights_from_disk``)."""

    name = "delta"

    def __init__(
        self, publisher: DeltaPublisher, local: LocalCheckpoint, post_write: PostWrite | None = None
    ) -> None:
        super().__init__()
        self.publisher, self.local, self.post_write = publisher, local, post_write

    async def push(self, engine: InferenceEngine, trainer: PolicyTrainer, weight_version: str) -> None:
        if trainer.lora_adapter() is not None:
            raise ValueError(
                "a LoRA run syncs its adapter (--weight-sync disk); a delta sync sends whole weights"
            )
        weights = await asyncio.to_thread(lambda: {k: v for k, v in trainer.weights().items()})
        folder, sizes = await asyncio.to_thread(self.publisher.publish, weights)
        self.timings = {
            "delta_tensors": sizes["tensors"],
            "delta_bytes": sizes["bytes"],
            "raw_bytes": sizes["raw_bytes"],
        }
        if self.post_write is not None:  # the version's files are complete; the engines have not read them
            await asyncio.to_thread(self.post_write, str(folder.resolve()), engine.replicas())
        await asyncio.to_thread(self.local.pull, self.publisher.folder, self.publisher.version)
        await engine.update_weights_from_disk(str(self.local.folder.resolve()), weight_version)
