"""The trainer's weights as byte buckets (:class:`FlatWeights`: every tensor's bytes in one tensor, which is
also the packed layout of vLLM's weight transfer), and the shapes SGLang's weight-update endpoints take (read
from sglang 0.5.17).

- ``/update_weights_from_tensor`` with ``load_format: "flattened_bucket"``: per tensor-parallel rank one
  base64 string of a ``ForkingPickler`` pickle of ``{"flattened_tensor", "metadata"}``: every tensor
  flattened to bytes and concatenated (one CUDA allocation, so one IPC handle), and per tensor its
  ``name, shape, dtype, start_idx, end_idx, numel``. The server unpickles it with an allowlist of modules
  (torch, ``types``, ``sglang.srt.weight_sync``, ...): the metadata is sglang's own
  ``FlattenedTensorMetadata`` and the pickling sglang's ``MultiprocessingSerializer`` (which records the
  device by UUID) when sglang is importable, else ``types.SimpleNamespace`` records and a plain
  ``ForkingPickler`` (device by index: trainer and server must see the same CUDA device numbering).
- ``/update_weights_from_distributed`` with ``load_format: "flattened_bucket"``: the same byte layout,
  broadcast from rank 0 of an NCCL group the servers joined through ``/init_weights_update_group``.
"""

from __future__ import annotations

import base64
import io
import os
import types
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.multiprocessing  # registers the tensor reductions with ForkingPickler

LOAD_FORMAT = "flattened_bucket"


@dataclass
class FlatWeights:
    """Named tensors flattened into one byte tensor, with the records to cut them back out."""

    flat: torch.Tensor
    names: list[str]
    shapes: list[list[int]]
    dtypes: list[torch.dtype]

    @classmethod
    def pack(cls, named: Iterable[tuple[str, torch.Tensor]]) -> FlatWeights:
        names, shapes, dtypes, pieces = [], [], [], []
        for name, tensor in named:
            names.append(name)
            shapes.append(list(tensor.shape))
            dtypes.append(tensor.dtype)
            pieces.append(tensor.detach().contiguous().flatten().view(torch.uint8))
        if not pieces:
            raise ValueError("no weights to send")
        return cls(torch.cat(pieces), names, shapes, dtypes)

    def records(self, record_type: Any = types.SimpleNamespace) -> list[Any]:
        """One record per tensor with the fields SGLang's bucket reads."""
        out, start = [], 0
        for name, shape, dtype in zip(self.names, self.shapes, self.dtypes, strict=True):
            numel = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            out.append(
                record_type(
                    name=name,
                    shape=torch.Size(shape),
                    dtype=dtype,
                    start_idx=start,
                    end_idx=start + numel,
                    numel=numel,
                )
            )
            start += numel
        return out

    def unpack(self) -> list[tuple[str, torch.Tensor]]:
        """The named tensors again (views into :attr:`flat`), as the server rebuilds them."""
        return [
            (r.name, self.flat[r.start_idx : r.end_idx].view(r.dtype).reshape(r.shape))
            for r in self.records()
        ]

    def distributed_body(
        self, group_name: str, weight_version: str | None, flush_cache: bool = True
    ) -> dict[str, Any]:
        """The ``/update_weights_from_distributed`` body announcing this broadcast."""
        return {
            "names": self.names,
            "dtypes": [str(d).removeprefix("torch.") for d in self.dtypes],
            "shapes": self.shapes,
            "group_name": group_name,
            "flush_cache": flush_cache,
            "weight_version": weight_version,
            "load_format": LOAD_FORMAT,
        }


def serialize_for_sglang(weights: FlatWeights) -> str:
    """The ``serialized_named_tensors`` entry of one tensor-parallel rank (CUDA IPC handles, no data)."""
    if weights.flat.is_cuda:  # the server reads the memory on its own stream: the copy must be done
        torch.cuda.synchronize(weights.flat.device)
    try:
        from sglang.srt.utils.common import MultiprocessingSerializer
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata
    except ImportError:
        from multiprocessing.reduction import ForkingPickler

        buffer = io.BytesIO()
        ForkingPickler(buffer).dump({"flattened_tensor": weights.flat, "metadata": weights.records()})
        return base64.b64encode(buffer.getvalue()).decode()
    monkey_patch_torch_reductions()
    payload = {"flattened_tensor": weights.flat, "metadata": weights.records(FlattenedTensorMetadata)}
    return MultiprocessingSerializer.serialize(payload, output_str=True)


def init_broadcast_group(
    master_address: str,
    master_port: int,
    world_size: int,
    group_name: str,
    backend: str = "nccl",
    timeout: float = 600.0,
) -> Any:
    """Rank 0 (the trainer) of the group SGLang's ``/init_weights_update_group`` builds on its side: a
    TCP rendezvous at ``master_address:master_port`` with keys under ``group_name``, outside the default
    process group (which a megatron trainer already uses).

    NCCL's cuMem allocator is off on both sides (``NCCL_CUMEM_ENABLE=0`` unless set; launched servers get
    it from :func:`rlsdk.engines.launch.sglang.server_environment`): with it on, the first broadcast
    between the trainer and SGLang on two H200s failed in SGLang with "Cuda failure 'invalid argument'"."""
    os.environ.setdefault("NCCL_CUMEM_ENABLE", "0")  # read when NCCL builds the communicator
    return join_broadcast_group(master_address, master_port, 0, world_size, group_name, backend, timeout)


def join_broadcast_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str,
    timeout: float,
) -> Any:
    """Join, as ``rank``, the group whose members meet at ``master_address:master_port`` (a TCP rendezvous,
    store keys under ``group_name``), outside the default process group: each side's half of
    :func:`init_broadcast_group`."""
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        rendezvous,
    )

    store, rank, world_size = next(
        rendezvous(
            f"tcp://{master_address}:{master_port}", rank, world_size, timeout=timedelta(seconds=timeout)
        )
    )
    store.set_timeout(timedelta(seconds=timeout))
    group, _ = _new_process_group_helper(
        world_size,
        rank,
        [],
        Backend(backend),
        PrefixStore(group_name, store),
        group_name=group_name,  # type: ignore[arg-type]  # torch types it as GroupName, a NewType of str
        timeout=timedelta(seconds=timeout),
    )
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def broadcast(weights: FlatWeights, group: Any) -> None:
    """Send ``weights``' bytes to ``group`` from rank 0 (this process), waiting until they are out."""
    import torch.distributed as dist

    if weights.flat.is_cuda:
        torch.cuda.set_device(weights.flat.device)
    dist.broadcast(weights.flat, src=0, group=group)
    if weights.flat.is_cuda:
        torch.cuda.synchronize()
