"""The trainer's side of vLLM 0.26's weight transfer, held to what vLLM's own side does with it (restated from
``vllm/distributed/weight_transfer`` and ``vllm/distributed/utils.py``): the IPC update's fields and bytes, the
NCCL announcement that vLLM receives as one broadcast, and the rendezvous of its ``StatelessProcessGroup``
(the store rank 0 serves, the pickled ``ncclUniqueId`` the workers read). The NCCL communicator and the
broadcast themselves need GPUs: ``benchmarks/gpu/vllm_checks.py`` runs them against a real vLLM."""

from __future__ import annotations

import base64
import ctypes
import io
import math
import pickle
from datetime import timedelta

import pytest
import torch
from rlsdk.trainer_api import free_port
from rlsdk.engine_api import FlatWeights
from torch.multiprocessing.reductions import rebuild_tensor

from rlsdk_engine_vllm.transfer import (
    UNIQUE_ID_CLASS,
    UNIQUE_ID_KEY,
    aligned,
    ipc_update_info,
    nccl_update_info,
    serve_unique_id,
    unique_id_pickle,
)


class ncclUniqueId(ctypes.Structure):  # noqa: N801 (vLLM's name)
    """vLLM 0.26's structure (``pynccl_wrapper.py``), restated."""

    _fields_ = [("internal", ctypes.c_byte * 128)]


class VLLMUnpickler(pickle.Unpickler):
    """A vLLM worker's ``pickle.loads``, its class found where vLLM defines it."""

    def find_class(self, module: str, name: str):
        if (module, name) == UNIQUE_ID_CLASS:
            return ncclUniqueId
        return super().find_class(module, name)


def weights() -> FlatWeights:
    torch.manual_seed(0)
    return FlatWeights.pack(
        [
            ("a.weight", torch.randn(3, 4, dtype=torch.bfloat16)),
            ("b.bias", torch.randn(5)),
            ("c", torch.arange(6)),
        ]
    )


def test_the_unique_id_unpickles_into_vllms_structure_with_its_bytes():
    unique_id = bytes(range(128))
    loaded = VLLMUnpickler(io.BytesIO(unique_id_pickle(unique_id))).load()
    assert isinstance(loaded, ncclUniqueId) and bytes(loaded.internal) == unique_id
    with pytest.raises(ValueError, match="128 bytes, not 3"):
        unique_id_pickle(b"abc")


def test_a_worker_finds_the_unique_id_where_vllms_rendezvous_reads_it():
    """A worker's ``StatelessProcessGroup``: a store client at the master's address; its first
    ``broadcast_obj`` from rank 0 reads ``broadcast_from/0/0``."""
    unique_id, port = bytes(reversed(range(128))), free_port()
    store = serve_unique_id("127.0.0.1", port, 2, unique_id, timeout=30)
    worker = torch.distributed.TCPStore(
        "127.0.0.1", port, 2, is_master=False, timeout=timedelta(seconds=30), use_libuv=False
    )
    received = VLLMUnpickler(io.BytesIO(worker.get(UNIQUE_ID_KEY))).load()
    assert bytes(received.internal) == unique_id
    del store


def vllm_unpacks(info: dict) -> dict[str, torch.Tensor]:
    """vLLM's packed IPC consumer: the buffer cut by ``tensor_sizes``, each piece viewed in place as its dtype
    and shape (``unpack_tensor``), cloned."""
    handles = pickle.loads(base64.b64decode(info["ipc_handles_pickled"]))
    packed = rebuild_tensor(*handles["cpu"])
    pieces = packed[: sum(info["tensor_sizes"])].split(info["tensor_sizes"])
    return {
        name: piece.contiguous().view(getattr(torch, dtype)).view(*shape).clone()
        for name, piece, dtype, shape in zip(
            info["names"], pieces, info["dtype_names"], info["shapes"], strict=True
        )
    }


def test_an_ipc_update_is_what_vllms_ipc_backend_rebuilds():
    """``packed``: the handle to the bucket's bytes under its device, cut by ``tensor_sizes`` into the names,
    dtypes and shapes (here a CPU tensor, pickled whole where a GPU's would be a CUDA-IPC handle)."""
    bucket = FlatWeights.pack(
        [
            ("a.weight", torch.randn(3, 4, dtype=torch.bfloat16)),
            ("b.weight", torch.randn(2, 2, dtype=torch.bfloat16)),
        ]
    )
    info = ipc_update_info(bucket)
    assert info["names"] == ["a.weight", "b.weight"] and info["packed"] is True
    assert info["dtype_names"] == ["bfloat16", "bfloat16"] and info["shapes"] == [[3, 4], [2, 2]]
    assert info["tensor_sizes"] == [24, 8] and aligned(bucket) == [bucket]
    assert all(torch.equal(vllm_unpacks(info)[name], tensor) for name, tensor in bucket.unpack())


def test_a_bucket_of_mixed_dtypes_vllm_could_not_view_in_place_goes_one_dtype_at_a_time():
    """An int64 after 44 bytes of bfloat16 and float32 lies where vLLM cannot view it as int64 ("storage
    offset must be divisible by 8"): each dtype goes in a bucket of its own."""
    bucket = weights()
    with pytest.raises(RuntimeError, match="must be divisible by 8"):
        vllm_unpacks(ipc_update_info(bucket))
    parts = aligned(bucket)
    assert [p.names for p in parts] == [["a.weight"], ["b.bias"], ["c"]]
    received = {name: t for part in parts for name, t in vllm_unpacks(ipc_update_info(part)).items()}
    torch.manual_seed(0)
    sent = {
        "a.weight": torch.randn(3, 4, dtype=torch.bfloat16),
        "b.bias": torch.randn(5),
        "c": torch.arange(6),
    }
    assert received.keys() == sent.keys() and all(torch.equal(received[k], sent[k]) for k in sent)


def test_an_nccl_announcement_is_received_as_one_broadcast():
    """vLLM's packed consumer takes tensors until their bytes pass ``packed_buffer_size_bytes``, then receives
    a broadcast of that many bytes: with the bucket's size, the whole bucket in one."""
    bucket = weights()
    info = nccl_update_info(bucket)
    assert "ipc_handles_pickled" not in info and info["packed_buffer_size_bytes"] == bucket.flat.numel()
    chunks, current, total = [], 0, 0
    for shape, dtype in zip(info["shapes"], info["dtype_names"], strict=True):
        current += math.prod(shape) * getattr(torch, dtype).itemsize
        total += 1
        if current > info["packed_buffer_size_bytes"]:
            chunks.append(current)
            current = 0
    chunks += [current] if current else []
    assert chunks == [bucket.flat.numel()] and total == 3
