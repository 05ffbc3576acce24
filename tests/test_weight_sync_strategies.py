"""Weight-sync strategies: chosen by flags, the bytes SGLang's tensor endpoints take, and the call
sequences against SGLang's weight endpoints restated in a real server process.

CUDA IPC and NCCL need GPUs (benchmarks/gpu/gpu_loop.py runs them against real SGLang); here the
payload is built from CPU tensors (ForkingPickler shares them through file descriptors instead of CUDA
IPC handles, so the receiver borrows the sender's multiprocessing key to fetch them), unpickled in another process under SGLang 0.5.17's module allowlist and rebuilt the way
SGLang rebuilds a flattened bucket."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from typing import Any

import pytest
import torch

from rlsdk import (
    PluginCallError,
    RolloutConfig,
    RolloutFnTrainOutput,
    Runtime,
    Sample,
    UpdateWeightPostWrite,
    get_plugin_manager,
    hookimpl,
)
from rlsdk.engines.sglang_client import SGLangClient
from rlsdk.plugins.run_plugins import RunPlugins
from rlsdk.training.session import TrainingSession
from rlsdk.training.sync import (
    ColocatedTensorSync,
    DiskSync,
    InProcessSync,
    NcclBroadcastSync,
    WeightSyncError,
    check_tolerance,
    choose_sync,
)
from rlsdk.engines.tensor_transport import FlatWeights, serialize_for_sglang
from rlsdk.training.torch_trainer import TorchTrainer
from rlsdk.training_options import offloads
from rlsdk import Trainer
from rlsdk.testing import make_train_groups


class InProcessEngine:
    in_process_weights = True
    weight_transports: frozenset[str] = frozenset()
    url = None


def test_auto_picks_by_engine_and_colocate(tmp_path: Path):
    client = SGLangClient("http://127.0.0.1:1")
    assert isinstance(choose_sync(RolloutConfig(), InProcessEngine(), tmp_path), InProcessSync)  # type: ignore[arg-type]
    assert isinstance(choose_sync(RolloutConfig(colocate=True), client, tmp_path), ColocatedTensorSync)
    assert isinstance(choose_sync(RolloutConfig(), client, tmp_path), DiskSync)
    assert isinstance(choose_sync(RolloutConfig(weight_sync="nccl"), client, tmp_path), NcclBroadcastSync)
    assert isinstance(
        choose_sync(RolloutConfig(weight_sync="disk", colocate=True), client, tmp_path), DiskSync
    )


def test_trust_check_tolerance_defaults_by_where_the_trainer_runs():
    """float32 on CPU on both sides: 0.05 nats; on CUDA the engine serves bfloat16: 0.5; a given one wins.
    (Trainer stand-ins: only their ``device`` and ``dtype`` are read.)"""

    class On:
        def __init__(self, device: str, dtype: torch.dtype) -> None:
            self.device, self.dtype = torch.device(device), dtype

    default = RolloutConfig()
    assert check_tolerance(default, On("cpu", torch.float32)) == 0.05  # type: ignore[arg-type]
    assert check_tolerance(default, On("cuda", torch.float32)) == 2.0  # type: ignore[arg-type]
    assert check_tolerance(default, On("cpu", torch.bfloat16)) == 2.0  # type: ignore[arg-type]
    assert check_tolerance(RolloutConfig(sync_check_tol=0.2), On("cuda", torch.bfloat16)) == 0.2  # type: ignore[arg-type]


def test_impossible_choices_say_what_to_use(tmp_path: Path):
    client = SGLangClient("http://127.0.0.1:1")
    with pytest.raises(ValueError, match="needs --colocate .* use --weight-sync nccl"):
        choose_sync(RolloutConfig(weight_sync="tensor"), client, tmp_path)
    with pytest.raises(
        ValueError, match="--weight-sync nccl: InProcessEngine cannot .* it takes disk and in_process"
    ):
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


FAKE_SERVER = Path(__file__).with_name("fake_sglang_weights_server.py")


@pytest.fixture
def weights_server(tmp_path: Path):
    """SGLang's weight endpoints restated in a real server process (``fake_sglang_weights_server.py``)."""
    import httpx

    from rlsdk.trainer_api import free_port

    port = free_port()
    authkey = multiprocessing.current_process().authkey.hex()
    log = (tmp_path / "server.log").open("wb")
    server = subprocess.Popen([sys.executable, str(FAKE_SERVER), str(port), authkey], stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    try:
        yield url
    finally:
        server.kill()
        server.wait()


def loaded(url: str) -> dict:
    import httpx

    return httpx.get(f"{url}/loaded").json()


def assert_holds_trainer_weights(state: dict, trainer: TorchTrainer) -> None:
    weights = trainer.weights()
    assert set(state["weights"]) == set(weights)
    for name, (dtype, shape, total) in state["weights"].items():
        assert (dtype, shape) == (str(weights[name].dtype), list(weights[name].shape)), name
        assert total == pytest.approx(float(weights[name].float().sum()), rel=1e-5, abs=1e-5), name


@pytest.fixture
def trainer(tiny_llama: Path) -> TorchTrainer:
    return TorchTrainer(RolloutConfig(hf_checkpoint=str(tiny_llama), train=True, train_threads=1))


def test_colocated_sync_releases_then_resumes_weights_updates_then_resumes_the_cache(weights_server, trainer):
    client = SGLangClient(weights_server)
    sync = ColocatedTensorSync()

    async def two_steps() -> None:
        try:
            await sync.push(client, trainer, "1")  # a first sync with no train step before it releases first
            await sync.before_train(client)
            await sync.push(client, trainer, "2")
        finally:
            await client.close()

    asyncio.run(two_steps())
    state = loaded(weights_server)
    one_step = [
        "release:cuda_graph,kv_cache,weights",
        "resume:weights",
        "update_weights_from_tensor",
        "resume:cuda_graph,kv_cache",
    ]
    assert state["calls"] == one_step * 2 and state["weight_version"] == "2"
    assert set(sync.timings) == {
        "release_seconds",
        "resume_weights_seconds",
        "update_seconds",
        "resume_cache_seconds",
        "buckets",
    }
    assert_holds_trainer_weights(state, trainer)


def test_broadcast_sync_joins_the_group_once_and_sends_the_weights(weights_server, trainer):
    """NCCL's protocol over gloo (no GPUs here): rendezvous, group, one flattened broadcast per sync."""
    client = SGLangClient(weights_server)
    sync = NcclBroadcastSync(backend="gloo")

    async def two_syncs() -> None:
        try:
            await sync.push(client, trainer, "1")
            with torch.no_grad():
                next(trainer.model.parameters()).add_(1.0)
            await sync.push(client, trainer, "2")
        finally:
            await client.close()

    asyncio.run(two_syncs())
    state = loaded(weights_server)
    assert state["calls"] == ["init_weights_update_group"] + ["update_weights_from_distributed"] * 2
    assert sync.timings["join_seconds"] < 0.05 and sync.timings["broadcast_seconds"] > 0  # joined once
    assert state["weight_version"] == "2"
    assert_holds_trainer_weights(state, trainer)


@pytest.mark.parametrize("strategy", ["tensor", "nccl"])
def test_the_weights_check_compares_sglangs_fused_tensors_and_names_one_a_sync_missed(
    weights_server, trainer, strategy
):
    """After a full sync every tensor SGLang holds (qkv_proj and gate_up_proj fused) has the trainer's
    checksum; after a sync that left ``v_proj`` of layer 0 out, the check names the fused tensor holding it."""
    from rlsdk.training.trust import check_weights

    client = SGLangClient(weights_server)
    sync: ColocatedTensorSync | NcclBroadcastSync = ColocatedTensorSync()
    if strategy == "nccl":
        sync = NcclBroadcastSync(backend="gloo")
    missed = "model.layers.0.self_attn.v_proj.weight"

    async def full_then_partial() -> tuple[Any, str]:
        try:
            await sync.push(client, trainer, "1")
            verdict = await check_weights(client, trainer, 1)
            with torch.no_grad():
                trainer.model.state_dict()[missed].add_(1.0)
            buckets = trainer.weight_buckets
            trainer.weight_buckets = lambda size: (  # type: ignore[method-assign]
                {k: v for k, v in b.items() if k != missed} for b in buckets(size)
            )
            await sync.push(client, trainer, "2")
            with pytest.raises(WeightSyncError) as caught:
                await check_weights(client, trainer, 2)
            return verdict, str(caught.value)
        finally:
            await client.close()

    verdict, error = asyncio.run(full_then_partial())
    assert verdict.complete and verdict.tensors == 14  # per layer qkv, o, gate_up, down, 2 norms; embed, norm
    assert "1 of 14 tensors" in error and "model.layers.0.self_attn.qkv_proj.weight" in error
    assert "the trainer's q_proj, k_proj, v_proj" in error and "did not reach the engine" in error


@pytest.mark.parametrize("strategy", ["tensor", "nccl"])
def test_a_sync_sends_buckets_of_the_buffer_size_with_the_version_on_the_last(
    weights_server, trainer, strategy
):
    """``update_weight_buffer_size`` bounds each update: the weights arrive in several calls, in order, none
    above the size unless one tensor is (a bucket of its own); the version and the cache flush come with the
    last call only, and the engine ends up with the whole model."""
    client = SGLangClient(weights_server)
    weights = trainer.weights()
    size = {name: t.numel() * t.element_size() for name, t in weights.items()}
    limit = sum(size.values()) // 5
    sync = (
        ColocatedTensorSync(release=False, bucket_bytes=limit)
        if strategy == "tensor"
        else NcclBroadcastSync(backend="gloo", bucket_bytes=limit)
    )

    async def one_sync() -> None:
        try:
            await sync.push(client, trainer, "3")
        finally:
            await client.close()

    asyncio.run(one_sync())
    state = loaded(weights_server)
    updates = state["updates"]
    assert len(updates) >= 5
    assert [name for names, _, _ in updates for name in names] == list(weights)
    for names, _, _ in updates:
        assert len(names) == 1 or sum(size[n] for n in names) <= limit, names
    assert [version for _, version, _ in updates] == [None] * (len(updates) - 1) + ["3"]
    assert [flush for _, _, flush in updates] == [False] * (len(updates) - 1) + [True]
    assert state["weight_version"] == "3" and sync.timings["buckets"] == len(updates)
    assert_holds_trainer_weights(state, trainer)


class FailsHalfWay(TorchTrainer):
    """The torch trainer whose bucket stream fails after two buckets when there are more (a rank lost
    mid-sync); the sync has sent the first (it reads one ahead)."""

    def weight_buckets(self, bucket_bytes: int) -> Any:
        buckets = list(super().weight_buckets(bucket_bytes))
        yield from buckets[:2]
        if len(buckets) > 2:
            raise RuntimeError("rank 1 exited")


def test_a_sync_that_stops_half_way_leaves_the_engine_on_its_old_version(weights_server, tiny_llama):
    """The engine took the first bucket, but the version it reports is still the last whole sync's: the
    weight-version handshake sees the engine is not on the trainer's weights."""
    failing = FailsHalfWay(RolloutConfig(hf_checkpoint=str(tiny_llama), train=True, train_threads=1))
    client = SGLangClient(weights_server)
    sync = NcclBroadcastSync(backend="gloo")

    async def two_syncs() -> None:
        try:
            await sync.push(client, failing, "1")  # one bucket: whole
            sync.bucket_bytes = 1
            with pytest.raises(RuntimeError, match="rank 1 exited"):
                await sync.push(client, failing, "2")
        finally:
            await client.close()

    asyncio.run(two_syncs())
    state = loaded(weights_server)
    assert [version for _, version, _ in state["updates"]] == ["1", None]
    assert state["weight_version"] == "1"


# ---------------------------------------------------------------------------- colocated memory offload
#
# slime's --offload, --offload-train, --offload-rollout: the order in which a training step frees and takes
# back GPU memory, against the server above. The trainer is the real torch trainer on a tiny Llama with its
# offload/onload calls recorded (on CPU they have nothing to move; on CUDA they move the AdamW state to
# page-locked CPU memory and back: benchmarks/gpu/scale.py measures that).


class RecordingTrainer(TorchTrainer):
    """The torch trainer, each memory move and each use of its weights recorded in order."""

    def __init__(self, args: Any) -> None:
        super().__init__(args)
        self.events: list[str] = []

    def offload(self) -> None:
        self.events.append("offload")
        super().offload()

    def onload(self) -> None:
        self.events.append("onload")
        super().onload()

    def train_step(self, rollout_id: int, groups: list[list[Sample]]) -> dict[str, float]:
        self.events.append("train_step")
        return super().train_step(rollout_id, groups)

    def weights(self) -> Any:
        self.events.append("weights")
        return super().weights()


def one_step(url: str, tiny_llama: Path, tmp_path: Path, **flags: Any) -> tuple[list[str], list[str], dict]:
    """One training step of a colocated run with ``flags``: the trainer's events, SGLang's calls, metrics."""
    args = RolloutConfig(
        hf_checkpoint=str(tiny_llama),
        train=True,
        train_threads=1,
        colocate=True,
        sync_check_tol=100.0,
        **flags,
    )
    plugins = RunPlugins(args, get_plugin_manager(load_entrypoints=False))
    plugins.swap(Trainer, RecordingTrainer)
    engine = SGLangClient(url)
    runtime = Runtime(plugins.pm, engine, run_plugins=plugins)
    try:
        session = TrainingSession(args, runtime, tmp_path)
        trainer = session.trainer
        assert isinstance(trainer, RecordingTrainer)
        session.drift.baseline = (
            1.0  # the drift check's noise, which it would measure with /generate (the fake has none)
        )
        result = RolloutFnTrainOutput(samples=make_train_groups(length=8, response_length=3))
        try:  # the loop's train and sync verbs
            metrics = session.train(0, result)
            metrics.update(session.publish(result))
        except Exception as exc:  # the fake server has no /generate: the trust check after the sync
            metrics = {"error": repr(exc)}
        session.close()
    finally:
        runtime.run(engine.close())
        runtime.loop.close()
    return trainer.events, loaded(url)["calls"], metrics


def test_colocate_offloads_both_ways_in_slimes_order(weights_server, tiny_llama, tmp_path):
    """The trainer offloads before the engines' first rollout; each step: the engines release, the trainer
    takes its state back, trains, offloads again, and only then the engines take their memory back and get
    the weights."""
    events, calls, _ = one_step(weights_server, tiny_llama, tmp_path)
    assert events[:5] == ["offload", "onload", "train_step", "offload", "weights"]
    assert calls == [
        "release:cuda_graph,kv_cache,weights",
        "resume:weights",
        "update_weights_from_tensor",
        "resume:cuda_graph,kv_cache",
    ]


def test_no_offload_flags_keep_memory_where_it_is(weights_server, tiny_llama, tmp_path):
    """``--no-offload-train --no-offload-rollout`` with ``--colocate``: nothing moves; the update flushes
    the engine's cache itself."""
    events, calls, _ = one_step(
        weights_server, tiny_llama, tmp_path, offload_train=False, offload_rollout=False
    )
    assert events[:2] == ["train_step", "weights"] and "offload" not in events
    assert calls == ["update_weights_from_tensor"]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({}, (False, False)),
        ({"colocate": True}, (True, True)),
        ({"offload": True}, (True, True)),
        ({"colocate": True, "offload_train": False}, (False, True)),
        ({"offload_rollout": True}, (False, True)),
    ],
)
def test_offload_flags_resolve_as_slimes(flags, expected):
    assert offloads(RolloutConfig(**flags)) == expected


def test_choose_sync_keeps_the_engines_memory_without_offload_rollout(tmp_path):
    client = SGLangClient("http://127.0.0.1:1")
    assert choose_sync(RolloutConfig(colocate=True), client, tmp_path).release  # type: ignore[attr-defined]
    kept = choose_sync(RolloutConfig(colocate=True, offload_rollout=False), client, tmp_path)
    assert isinstance(kept, ColocatedTensorSync) and not kept.release


# ---------------------------------------------------------------------------- update_weight_post_write
#
# slime's --custom-update-weight-post-write-path: hook(args, version_dir, rollout_engines), called after a disk
# weight sync's files are written and before the engines read them (slime: update_weight_from_disk.py).


def post_write_session(
    url: str, tiny_llama: Path, tmp_path: Path, hook: Any
) -> tuple[TrainingSession, Runtime]:
    """A training session syncing through disk to the server at ``url``, ``hook`` its post-write plugin."""

    class PostWrite:
        @hookimpl
        def rlsdk_update_weight_post_writes(self):
            yield UpdateWeightPostWrite(name="publish", func=hook)

    args = RolloutConfig(
        hf_checkpoint=str(tiny_llama),
        train=True,
        train_threads=1,
        weight_sync="disk",
        custom_update_weight_post_write_path="publish",
    )
    pm = get_plugin_manager(load_entrypoints=False, plugins=[PostWrite()])
    runtime = Runtime(pm, SGLangClient(url), run_plugins=RunPlugins(args, pm))
    return TrainingSession(args, runtime, tmp_path), runtime


def test_disk_sync_calls_the_post_write_hook_between_writing_and_the_engines_read(
    weights_server, tiny_llama, tmp_path
):
    seen: list[tuple[str, list[str], list[str], list[Any]]] = []

    def publish(args, version_dir, rollout_engines):
        files = sorted(p.name for p in Path(version_dir).iterdir())
        seen.append((version_dir, files, list(loaded(weights_server)["calls"]), rollout_engines))

    session, runtime = post_write_session(weights_server, tiny_llama, tmp_path, publish)
    try:
        session.sync()
        session.weight_version = 1
        session.sync()
    finally:
        session.close()
        runtime.run(runtime.engine.close())
        runtime.loop.close()
    assert len(seen) == 2  # once per sync
    folder, files, calls_then, engines = seen[0]
    assert folder == str((tmp_path / "sync-weights").resolve())
    assert {"config.json", "model.safetensors"} <= set(files)  # complete, not a staging folder
    assert calls_then == []  # the engine had not read the weights yet
    assert engines == [runtime.engine]
    assert seen[1][2] == ["update_weights_from_disk"]  # the second write came after the first read
    state = loaded(weights_server)
    assert state["calls"] == ["update_weights_from_disk"] * 2 and state["weight_version"] == "1"
    weights = session.trainer.weights()
    assert state["weights"] and set(state["weights"]) <= set(weights)  # a tied lm_head is not written
    for name, (_, shape, total) in state["weights"].items():
        assert shape == list(weights[name].shape)
        assert total == pytest.approx(float(weights[name].float().sum()), rel=1e-5, abs=1e-5), name


def test_a_failing_post_write_hook_stops_the_sync_before_the_engines_read(
    weights_server, tiny_llama, tmp_path
):
    def publish(args, version_dir, rollout_engines):
        raise OSError("object store unreachable")

    session, runtime = post_write_session(weights_server, tiny_llama, tmp_path, publish)
    try:
        with pytest.raises(
            PluginCallError,
            match=r"update_weight_post_write 'publish' .* after the weights were "
            r"written to .*sync-weights raised OSError: object store unreachable",
        ):
            session.sync()
    finally:
        session.close()
        runtime.run(runtime.engine.close())
        runtime.loop.close()
    assert loaded(weights_server)["calls"] == []  # nothing read the unpublished files


def test_a_post_write_hook_needs_the_disk_sync(tmp_path: Path):
    """slime calls the hook from its disk syncs only: rlsdk refuses it with another transport instead of
    skipping it silently."""

    class PostWrite:
        @hookimpl
        def rlsdk_update_weight_post_writes(self):
            yield UpdateWeightPostWrite(name="publish", func=lambda args, version_dir, rollout_engines: None)

    hook = get_plugin_manager(load_entrypoints=False, plugins=[PostWrite()]).resolve(
        "update_weight_post_write", "publish"
    )
    client = SGLangClient("http://127.0.0.1:1")
    with pytest.raises(
        ValueError, match="runs after a disk weight sync wrote its files; this run syncs nccl"
    ):
        choose_sync(RolloutConfig(weight_sync="nccl"), client, tmp_path, hook)
    with pytest.raises(ValueError, match="this run syncs in_process: pass --weight-sync disk"):
        choose_sync(RolloutConfig(), InProcessEngine(), tmp_path, hook)  # type: ignore[arg-type]
    assert isinstance(choose_sync(RolloutConfig(weight_sync="disk"), client, tmp_path, hook), DiskSync)
