"""The trainer's side of vLLM 0.26's weight transfer (read from ``vllm/distributed/weight_transfer``), in torch
alone: the trainer's environment need not have vLLM.

- IPC (``--weight-transfer-config '{"backend": "ipc"}'``, colocated): one ``/update_weights`` per bucket with
  ``packed: true``, the bucket's ``names``, ``dtype_names``, ``shapes`` and per-tensor ``tensor_sizes`` (bytes),
  and ``ipc_handles_pickled``: base64 of a pickle of ``{GPU UUID: the arguments of torch's
  rebuild_cuda_tensor}`` for the bucket's one byte tensor. vLLM rebuilds it on its own device (argument 6),
  cuts it by ``tensor_sizes`` and clones each tensor.
- NCCL (``"backend": "nccl"``, engines on other GPUs): the workers join a ``StatelessProcessGroup``: a TCP
  store whose server is rank 0 (the trainer) at ``master_address:master_port``, where rank 0 sets
  ``broadcast_from/0/0`` to a pickle of vLLM's ``ncclUniqueId`` (a ctypes structure of 128 bytes) which the
  others read; then all build one NCCL communicator from it (``ncclCommInitRank``) and all-reduce one float32
  zero to warm it up. Each ``/update_weights`` (``packed``, ``packed_buffer_size_bytes`` the bucket's size) then
  receives one broadcast from rank 0 of the bucket's bytes. The trainer's side uses torch's own NCCL bindings
  (``torch.cuda.nccl``) on the unique id it sends.

A bucket's bytes are :class:`~rlsdk.engines.tensor_transport.FlatWeights`' (every tensor's bytes in order),
which is vLLM's packed layout; vLLM views each tensor's bytes in place as its dtype, so a bucket of mixed
dtypes that would not lie at multiples of their sizes goes as one bucket per dtype (:func:`aligned`).
"""

from __future__ import annotations

import base64
import os
import pickle
from datetime import timedelta
from typing import Any

import torch

UNIQUE_ID_CLASS = ("vllm.distributed.device_communicators.pynccl_wrapper", "ncclUniqueId")
"""Where vLLM 0.26 defines the ctypes structure its workers unpickle the NCCL unique id into."""
UNIQUE_ID_KEY = "broadcast_from/0/0"
"""The store key of rank 0's first ``broadcast_obj`` (a ``StatelessProcessGroup``'s counter starts at 0)."""


def sizes(weights: Any) -> list[int]:
    """Each tensor's size in bytes, in the bucket's order."""
    return [
        torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        for shape, dtype in zip(weights.shapes, weights.dtypes, strict=True)
    ]


def aligned(weights: Any) -> list[Any]:
    """``weights`` as buckets vLLM can cut back into tensors: it views each tensor's bytes as its dtype where
    they lie in the buffer, which needs them at a multiple of the dtype's size. A bucket of mixed dtypes
    whose tensors do not all lie so is sent as one bucket per dtype."""
    start = 0
    for size, dtype in zip(sizes(weights), weights.dtypes, strict=True):
        if start % torch.empty((), dtype=dtype).element_size():
            by_dtype: dict[Any, list[tuple[str, torch.Tensor]]] = {}
            for record in weights.records():  # each copied out first: in place it cannot be viewed either
                tensor = weights.flat[record.start_idx : record.end_idx].clone().view(record.dtype)
                by_dtype.setdefault(record.dtype, []).append((record.name, tensor.reshape(record.shape)))
            return [type(weights).pack(named) for named in by_dtype.values()]
        start += size
    return [weights]


def _described(weights: Any) -> dict[str, Any]:
    return {
        "names": list(weights.names),
        "dtype_names": [str(d).removeprefix("torch.") for d in weights.dtypes],
        "shapes": [list(s) for s in weights.shapes],
        "packed": True,
    }


def device_key(tensor: torch.Tensor) -> str:
    """The key vLLM finds a handle under: the UUID of the GPU holding ``tensor`` (``"cpu"`` off the GPU,
    where only a stand-in server can read it)."""
    if not tensor.is_cuda:
        return "cpu"
    return str(torch.cuda.get_device_properties(tensor.device).uuid)


def ipc_update_info(weights: Any) -> dict[str, Any]:
    """The ``update_info`` of one bucket for vLLM's IPC backend (over HTTP: the handles pickled)."""
    from torch.multiprocessing.reductions import reduce_tensor

    if weights.flat.is_cuda:  # the server reads the memory on its own stream: the copy must be done
        torch.cuda.synchronize(weights.flat.device)
    _, rebuild_args = reduce_tensor(weights.flat)
    handles = {device_key(weights.flat): rebuild_args}
    return {
        **_described(weights),
        "tensor_sizes": sizes(weights),
        "ipc_handles_pickled": base64.b64encode(pickle.dumps(handles)).decode(),
    }


def nccl_update_info(weights: Any) -> dict[str, Any]:
    """The ``update_info`` announcing one bucket's broadcast: one packed buffer of exactly its bytes, so vLLM
    receives it in one broadcast."""
    return {**_described(weights), "packed_buffer_size_bytes": int(weights.flat.numel())}


def unique_id_pickle(unique_id: bytes) -> bytes:
    """What ``pickle.dumps`` of vLLM's ``ncclUniqueId`` holding ``unique_id`` gives (ctypes structures pickle
    as ``_ctypes._unpickle(cls, (instance dict, raw bytes))``), written without vLLM: protocol 3 opcodes."""
    if len(unique_id) != 128:
        raise ValueError(f"an NCCL unique id has 128 bytes, not {len(unique_id)}")
    module, name = UNIQUE_ID_CLASS
    return b"".join(
        [
            b"\x80\x03",  # PROTO 3
            b"c_ctypes\n_unpickle\n",  # GLOBAL
            f"c{module}\n{name}\n".encode(),  # GLOBAL
            b"}",  # EMPTY_DICT
            b"C\x80" + unique_id,  # SHORT_BINBYTES, 128 bytes
            b"\x86\x86R.",  # TUPLE2 (dict, bytes), TUPLE2 (class, state), REDUCE, STOP
        ]
    )


class WeightGroup:
    """The trainer's end of vLLM's weight-transfer group: rank 0 of an NCCL communicator, and the store the
    workers met at (kept while they are connected)."""

    def __init__(self, store: Any, communicator: Any, device: int) -> None:
        self.store = store
        self.communicator = communicator
        self.device = device

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Send ``tensor``'s bytes to every worker, waiting until they are out."""
        with torch.cuda.device(self.device):
            torch.cuda.nccl.broadcast([tensor], root=0, comms=[self.communicator])
            torch.cuda.synchronize()

    def close(self) -> None:
        self.communicator = None
        self.store = None


def serve_unique_id(
    master_address: str, master_port: int, world_size: int, unique_id: bytes, timeout: float = 600.0
) -> Any:
    """The store of vLLM's rendezvous, served by rank 0 (this process), holding ``unique_id`` for the others."""
    store = torch.distributed.TCPStore(
        master_address,
        master_port,
        world_size,
        is_master=True,
        timeout=timedelta(seconds=timeout),
        wait_for_workers=False,
        use_libuv=False,  # as vLLM's StatelessProcessGroup
    )
    store.set(UNIQUE_ID_KEY, unique_id_pickle(unique_id))  # type: ignore[arg-type]  # bytes, as vLLM's own
    return store


def open_group(master_address: str, master_port: int, world_size: int, timeout: float = 600.0) -> WeightGroup:
    """Rank 0 of the group vLLM's workers form in ``/init_weight_transfer_engine``: serve the store with a fresh
    NCCL unique id, build the communicator on this process's GPU (blocks until every worker has joined) and
    take part in vLLM's warm-up all-reduce. NCCL's cuMem allocator is off (``NCCL_CUMEM_ENABLE=0`` unless
    set) on both sides: rlsdk starts vLLM so (:func:`rlsdk_engine_vllm.launch.server_environment`), as it
    starts SGLang, whose first broadcast with the trainer failed with it on."""
    os.environ.setdefault("NCCL_CUMEM_ENABLE", "0")
    unique_id = torch.cuda.nccl.unique_id()
    store = serve_unique_id(master_address, master_port, world_size, unique_id, timeout)
    device = torch.cuda.current_device()
    with torch.cuda.device(device):
        communicator = torch.cuda.nccl.init_rank(world_size, unique_id, 0)
        warm = torch.zeros(1, device=f"cuda:{device}")
        torch.cuda.nccl.all_reduce([warm], comms=[communicator])
        torch.cuda.synchronize()
    return WeightGroup(store, communicator, device)
