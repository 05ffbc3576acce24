"""Delta weight sync over disk (slime's ``--update-weight-mode delta --update-weight-transport disk``): each sync
ships only the bytes that changed since the last one (the format: :mod:`rlsdk.engines.delta_weights`).

The trainer keeps a CPU snapshot of every tensor, seeded from the base checkpoint the engines started from
(``hf_checkpoint``: the engine's actual weights, whatever the trainer's own round trip would give). Each sync
diffs the trainer's tensors against it and publishes the next version under ``update_weight_disk_dir`` (shared
with the engines' hosts); the sync (:class:`rlsdk.training.sync.DeltaDiskSync`) then has each engine pull it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import save_file

from ..engines.delta_weights import (
    CHECKSUMS,
    ENCODINGS,
    INDEX,
    VERSION_FOLDER,
    digest,
    encode,
    raw_bytes,
    read_checkpoint,
)

FILE_BYTES = 2 << 30
"""Encoded bytes per ``model-*.safetensors`` file of a version, at most (one tensor may exceed it)."""


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
