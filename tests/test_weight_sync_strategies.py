"""Weight-sync strategies: chosen by flags, and the bytes SGLang's tensor endpoints take.

CUDA IPC and NCCL need GPUs (benchmarks/gpu/gpu_loop_check.py runs them against real SGLang); here the
payload is built from CPU tensors (ForkingPickler shares them through file descriptors instead of CUDA
IPC handles, so the receiver borrows the sender's multiprocessing key to fetch them), unpickled in another process under SGLang 0.5.17's module allowlist and rebuilt the way
SGLang rebuilds a flattened bucket."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rlsdk import RolloutConfig
from rlsdk.sglang_client import SGLangClient
from rlsdk.training.sync import ColocatedTensorSync, DiskSync, InProcessSync, NcclBroadcastSync, choose_sync
from rlsdk.training.tensor_transport import FlatWeights, serialize_for_sglang


class InProcessEngine:
    in_process_weights = True


def test_auto_picks_by_engine_and_colocate(tmp_path: Path):
    client = SGLangClient("http://127.0.0.1:1")
    assert isinstance(choose_sync(RolloutConfig(), InProcessEngine(), tmp_path), InProcessSync)  # type: ignore[arg-type]
    assert isinstance(choose_sync(RolloutConfig(colocate=True), client, tmp_path), ColocatedTensorSync)
    assert isinstance(choose_sync(RolloutConfig(), client, tmp_path), DiskSync)
    assert isinstance(choose_sync(RolloutConfig(weight_sync="nccl"), client, tmp_path), NcclBroadcastSync)
    assert isinstance(
        choose_sync(RolloutConfig(weight_sync="disk", colocate=True), client, tmp_path), DiskSync
    )


def test_impossible_choices_say_what_to_use(tmp_path: Path):
    client = SGLangClient("http://127.0.0.1:1")
    with pytest.raises(ValueError, match="needs --colocate .* use --weight-sync nccl"):
        choose_sync(RolloutConfig(weight_sync="tensor"), client, tmp_path)
    with pytest.raises(ValueError, match="--weight-sync nccl needs an SGLang engine"):
        choose_sync(RolloutConfig(weight_sync="nccl"), InProcessEngine(), tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="weight_sync must be one of auto, tensor, nccl, disk"):
        RolloutConfig(weight_sync="ipc")


SGLANG_RECEIVER = textwrap.dedent("""
    # SGLang 0.5.17's receiving side: its module allowlist (utils/common.py SafeUnpickler) and its
    # flattened-bucket rebuild (weight_sync/tensor_bucket.py), restated.
    import base64, io, json, multiprocessing, pickle, sys, torch
    multiprocessing.current_process().authkey = bytes.fromhex(sys.argv[1])  # to fetch the sender's fds
    ALLOWED = ("builtins.", "collections.", "copyreg.", "functools.", "itertools.", "operator.", "types.",
               "weakref.", "torch.", "multiprocessing.resource_sharer.", "multiprocessing.reduction.",
               "pickletools.", "sglang.srt.weight_sync.tensor_bucket.")
    class Allowlist(pickle.Unpickler):
        def find_class(self, module, name):
            if not (module + ".").startswith(ALLOWED):
                raise RuntimeError(f"blocked {module}.{name}")
            return super().find_class(module, name)
    payload = Allowlist(io.BytesIO(base64.b64decode(sys.stdin.read(), validate=True))).load()
    flat = payload["flattened_tensor"]
    for meta in payload["metadata"]:
        tensor = flat[meta.start_idx:meta.end_idx].view(meta.dtype).reshape(meta.shape)
        assert meta.numel == meta.end_idx - meta.start_idx
        print(json.dumps([meta.name, str(meta.dtype), list(tensor.shape), float(tensor.float().sum())]))
""")


def test_flattened_bucket_payload_is_what_sglang_rebuilds():
    torch.manual_seed(0)
    weights = {
        "model.embed_tokens.weight": torch.randn(8, 4, dtype=torch.bfloat16),
        "model.layers.0.self_attn.q_proj.bias": torch.randn(4, dtype=torch.float32),
        "model.norm.weight": torch.randn(4, dtype=torch.bfloat16),
    }
    flat = FlatWeights.pack(weights.items())
    assert [name for name, _ in flat.unpack()] == list(weights)
    assert all(torch.equal(t, weights[n]) for n, t in flat.unpack())
    payload = serialize_for_sglang(flat)  # sglang is not installed here: ForkingPickler + SimpleNamespace
    authkey = multiprocessing.current_process().authkey.hex()
    received = subprocess.run(
        [sys.executable, "-c", SGLANG_RECEIVER, authkey],
        input=payload,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert received.returncode == 0, received.stderr
    rows = [json.loads(line) for line in received.stdout.splitlines()]
    assert [r[:3] for r in rows] == [[n, str(t.dtype), list(t.shape)] for n, t in weights.items()]
    for (*_, total), tensor in zip(rows, weights.values(), strict=True):
        assert total == pytest.approx(float(tensor.float().sum()), rel=1e-6)


def test_distributed_body_announces_the_broadcast_layout():
    flat = FlatWeights.pack([("a", torch.zeros(2, 3, dtype=torch.bfloat16)), ("b", torch.zeros(5))])
    body = flat.distributed_body("g", "7")
    assert body == {
        "names": ["a", "b"],
        "dtypes": ["bfloat16", "float32"],
        "shapes": [[2, 3], [5]],
        "group_name": "g",
        "flush_cache": True,
        "weight_version": "7",
        "load_format": "flattened_bucket",
    }
    assert flat.flat.dtype == torch.uint8 and flat.flat.numel() == 2 * 3 * 2 + 5 * 4
