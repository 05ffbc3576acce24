"""Weight sync from the trainer to the engine, and the trust check that follows every sync.

Four strategies (``weight_sync``; ``auto`` picks by engine and ``colocate``):

- ``in_process``: an engine in this process (the embedded engine) takes the trainer's tensors directly.
- ``tensor`` (colocated on the GPUs): the engine releases its memory while the trainer runs
  (SGLang's ``/release_memory_occupation``, vLLM's ``/sleep``), takes the weights' memory back, receives
  CUDA-IPC handles to the trainer's tensors (nothing touches disk), then its KV cache and CUDA graphs.
- ``nccl`` (separate GPUs): the engine's servers join an NCCL group with the trainer as rank 0 (once) and
  receive a broadcast.

  Each engine carries both out in its own protocol (:meth:`InferenceEngine.update_weights_from_tensor`,
  :meth:`InferenceEngine.update_weights_from_distributed`; :attr:`InferenceEngine.weight_transports` says
  which it takes).

  Both send the weights in buckets of ``update_weight_buffer_size`` bytes (``PolicyTrainer.weight_buckets``),
  the new weight version with the last.
- ``disk``: the trainer writes a Hugging Face folder the engine loads (``/update_weights_from_disk``); an
  ``update_weight_post_write`` plugin runs between the two.

The trust check then asks the engine for the log-probs of a probe sample's response tokens (SGLang's
``logprob_start_len`` with ``max_new_tokens: 0``) and compares them with the trainer's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import RolloutConfig
from ..engines.engine import InferenceEngine
from ..engines.protocol import ReplicaLostError
from ..errors import RlsdkError
from ..plugins.calls import call_update_weight_post_write
from ..plugins.records import Resolved
from ..types import Sample
from ..options import UPDATE_WEIGHT_BUFFER_SIZE
from ..training_options import named_model_folder, offloads
from .trainer import PolicyTrainer

log = logging.getLogger(__name__)


class WeightSyncError(RlsdkError):
    """The engine serves other weights than the trainer's (the trust check failed)."""


class WeightSyncTimeout(WeightSyncError):
    """An engine did not complete its weight update within ``--weight-sync-timeout``: it counts as dead."""


class WeightSync:
    """How the trainer's weights reach the engine. :meth:`before_train` runs before each train step."""

    name = "base"
    timings: dict[str, float]
    """Seconds of the last push's parts, where a strategy splits them, and the buckets it sent
    (``train/sync_<part>`` metrics)."""

    def __init__(self) -> None:
        self.timings = {}
        self.adapter: str | None = None
        """The name of the LoRA adapter the engine serves (the last one pushed)."""

    async def swap_adapter(
        self, engine: InferenceEngine, weight_version: str, load: Callable[[str], Awaitable[None]]
    ) -> str | None:
        """Load the new adapter as ``rlsdk_v<weight_version>`` (``load(name)``), unload the one before, and
        set the engine's weight version (SGLang's ``/load_lora_adapter`` sets none). Returns the name
        unloaded, if any."""
        name = f"rlsdk_v{weight_version}"
        before = self.adapter
        await load(name)
        self.adapter = name
        if before is not None and before != name:
            await engine.unload_lora_adapter(before)
        await engine.update_weight_version(weight_version)
        return before if before != name else None

    async def before_train(self, engine: InferenceEngine) -> None:
        """Free what the engine holds that the trainer needs (colocated GPUs); nothing by default."""

    async def push(self, engine: InferenceEngine, trainer: PolicyTrainer, weight_version: str) -> None:
        raise NotImplementedError


class InProcessSync(WeightSync):
    name = "in_process"

    async def push(self, engine: InferenceEngine, trainer: PolicyTrainer, weight_version: str) -> None:
        adapter = trainer.lora_adapter()
        await engine.pause("in_place")
        try:
            if adapter is None:
                await engine.update_weights(trainer.weights(), weight_version)
            else:  # only the adapter travels; the engine merges it into the weights it has
                await self.swap_adapter(
                    engine,
                    weight_version,
                    lambda name: engine.load_lora_adapter_tensors(name, adapter.config, adapter.tensors),
                )
            await engine.flush_cache()
        finally:
            await engine.resume()


PostWrite = Callable[[str, list[InferenceEngine]], None]
"""``post_write(version_dir, engines)``: called once a version's files are written, before the engines read them."""


class DiskSync(WeightSync):
    name = "disk"

    def __init__(self, folder: Path, post_write: PostWrite | None = None) -> None:
        super().__init__()
        self.folder = folder
        self.post_write = post_write

    async def _written(self, engine: InferenceEngine, folder: Path) -> None:
        """update_weight_post_write: the files of ``folder`` are complete; the engines have not read them."""
        if self.post_write is not None:
            await asyncio.to_thread(self.post_write, str(folder.resolve()), engine.replicas())

    async def push(self, engine: InferenceEngine, trainer: PolicyTrainer, weight_version: str) -> None:
        if trainer.lora_adapter() is not None:
            await self._push_adapter(engine, trainer, weight_version)
            return
        staging = self.folder.with_name(self.folder.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        await asyncio.to_thread(trainer.save_hf_model, staging)
        shutil.rmtree(self.folder, ignore_errors=True)
        staging.rename(self.folder)
        await self._written(engine, self.folder)
        await engine.update_weights_from_disk(str(self.folder.resolve()), weight_version)

    async def _push_adapter(
        self, engine: InferenceEngine, trainer: PolicyTrainer, weight_version: str
    ) -> None:
        """The adapter alone, as a PEFT folder per version (``<folder>/rlsdk_v<N>``) that the engine loads
        through ``/load_lora_adapter``; the folder of the adapter it replaced goes."""
        folder = self.folder / f"rlsdk_v{weight_version}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(trainer.save_lora_adapter, folder)
        await self._written(engine, folder)
        path = str(folder.resolve())
        unloaded = await self.swap_adapter(
            engine, weight_version, lambda name: engine.load_lora_adapter(name, path)
        )
        if unloaded is not None:
            shutil.rmtree(self.folder / unloaded, ignore_errors=True)


class DeltaDiskSync(WeightSync):
    """Publish the trainer's changed bytes as the next version, then have each engine pull it: its host
    patches its local checkpoint and the engine reloads that."""

    name = "delta"

    def __init__(self, publisher: Any, local: Path, post_write: PostWrite | None = None) -> None:
        """``publisher``: a :class:`rlsdk.training.delta_sync.DeltaPublisher`."""
        super().__init__()
        self.publisher, self.local, self.post_write = publisher, local, post_write

    async def push(self, engine: InferenceEngine, trainer: PolicyTrainer, weight_version: str) -> None:
        if trainer.lora_adapter() is not None:
            raise ValueError(
                "a LoRA run syncs its adapter (--weight-sync disk); a delta sync sends whole weights"
            )
        weights = await asyncio.to_thread(lambda: dict(trainer.weights()))
        folder, sizes = await asyncio.to_thread(self.publisher.publish, weights)
        self.timings = {
            "delta_tensors": sizes["tensors"],
            "delta_bytes": sizes["bytes"],
            "delta_raw_bytes": sizes["raw_bytes"],
        }
        if self.post_write is not None:  # the version's files are complete; the engines have not read them
            await asyncio.to_thread(self.post_write, str(folder.resolve()), engine.replicas())
        from ..engines.delta_weights import DeltaPull  # numpy, torch, safetensors: where a delta sync runs

        pull = DeltaPull(
            published=str(self.publisher.folder.resolve()),
            version=self.publisher.version,
            local=str(self.local.resolve()),
            base=str(self.publisher.base.resolve()),
        )
        await engine.pull_weights(pull, weight_version)


class ColocatedTensorSync(WeightSync):
    """CUDA IPC into an engine sharing the trainer's GPUs (:meth:`InferenceEngine.update_weights_from_tensor`;
    SGLang launched with ``--enable-memory-saver``, vLLM with ``--enable-sleep-mode``). With ``release``
    (``offload_rollout``, on with ``colocate``) the engine gives its GPU memory up while the trainer trains;
    without it it keeps it, and the update flushes its cache."""

    name = "tensor"

    def __init__(self, release: bool = True, bucket_bytes: int = UPDATE_WEIGHT_BUFFER_SIZE) -> None:
        super().__init__()
        self.release = release
        self.released = False
        self.release_seconds = 0.0
        self.bucket_bytes = bucket_bytes

    async def before_train(self, engine: InferenceEngine) -> None:
        if not self.release:
            return
        started = time.perf_counter()
        await engine.flush_cache()
        await engine.release_memory()
        self.released = True
        self.release_seconds = time.perf_counter() - started

    async def push(self, engine: InferenceEngine, trainer: PolicyTrainer, weight_version: str) -> None:
        if self.release and not self.released:  # a sync with no train step before it (a restored checkpoint)
            await self.before_train(engine)
        started = time.perf_counter()
        if self.release:
            await engine.resume_memory(["weights"])
        resumed = time.perf_counter()
        sent = Sent()
        async with contextlib.aclosing(
            _flat_buckets(trainer, self.bucket_bytes, sent, collect_ipc=True)
        ) as buckets:
            # No flush with a release: the cache was flushed before it and the KV cache is not back yet
            # (slime's order: weights, update, then KV cache and CUDA graphs).
            await engine.update_weights_from_tensor(buckets, weight_version, flush_cache=not self.release)
        await asyncio.to_thread(_collect_ipc)
        updated = time.perf_counter()
        if self.release:
            await engine.resume_memory(["kv_cache", "cuda_graph"])
        self.released = False
        self.timings = {
            "release_seconds": self.release_seconds,
            "resume_weights_seconds": resumed - started,
            "update_seconds": updated - resumed,
            "resume_cache_seconds": time.perf_counter() - updated,
            "buckets": sent.buckets,
        }


@dataclass
class Sent:
    """How many buckets a sync handed its engine."""

    buckets: int = 0


async def _flat_buckets(
    trainer: PolicyTrainer, bucket_bytes: int, sent: Sent, collect_ipc: bool = False
) -> AsyncGenerator[tuple[Any, bool], None]:
    """The trainer's :meth:`~PolicyTrainer.weight_buckets`, each packed into one
    :class:`~rlsdk.engines.tensor_transport.FlatWeights`, with whether it is the last (one bucket is read
    ahead to know). With ``collect_ipc`` the CUDA-IPC memory of a bucket is freed once the engine asks for the
    next (it has dropped its handles then). The buckets are read to the end even when the sync stops half way,
    since the other ranks of a trainer take part in each."""
    from ..engines.tensor_transport import FlatWeights

    buckets = trainer.weight_buckets(bucket_bytes)

    def pack_next() -> Any:
        bucket = next(buckets, None)
        return None if bucket is None else FlatWeights.pack(bucket.items())

    try:
        current = await asyncio.to_thread(pack_next)
        if current is None:
            raise WeightSyncError(f"{type(trainer).__name__}.weight_buckets() gave no weights to send")
        while current is not None:
            following = await asyncio.to_thread(pack_next)
            sent.buckets += 1
            yield current, following is None
            current = following
            if collect_ipc:
                await asyncio.to_thread(_collect_ipc)  # the bucket before: the engine dropped it
    finally:
        await asyncio.to_thread(_drain, buckets)


def _drain(buckets: Iterator[Any]) -> None:
    with contextlib.suppress(ValueError):  # still running in a thread a cancelled sync left behind
        for _ in buckets:
            pass


def _collect_ipc() -> None:
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.ipc_collect()  # free the trainer's copy once the engines dropped their handles


class NcclBroadcastSync(WeightSync):
    """A broadcast from the trainer (rank 0) to engines on other GPUs, in a group the engine forms with it
    (:meth:`InferenceEngine.join_weight_broadcast`, once)."""

    name = "nccl"

    def __init__(
        self,
        master_address: str = "127.0.0.1",
        backend: str = "nccl",
        bucket_bytes: int = UPDATE_WEIGHT_BUFFER_SIZE,
    ) -> None:
        super().__init__()
        self.master_address = master_address
        self.backend = backend
        self.bucket_bytes = bucket_bytes

    async def push(self, engine: InferenceEngine, trainer: PolicyTrainer, weight_version: str) -> None:
        started = time.perf_counter()
        await engine.join_weight_broadcast(self.master_address, self.backend)
        joined = time.perf_counter()
        sent = Sent()
        async with contextlib.aclosing(_flat_buckets(trainer, self.bucket_bytes, sent)) as buckets:
            await engine.update_weights_from_distributed(buckets, weight_version)
        self.timings = {
            "join_seconds": joined - started,
            "broadcast_seconds": time.perf_counter() - joined,
            "buckets": sent.buckets,
        }


def choose_sync(
    args: RolloutConfig, engine: InferenceEngine, disk_folder: Path, post_write: Resolved | None = None
) -> WeightSync:
    """The strategy ``args.weight_sync`` names; ``auto``: in process for an in-process engine, ``tensor``
    with ``colocate``, else ``disk``. ``post_write`` (an ``update_weight_post_write`` plugin) needs ``disk``."""
    mode = getattr(args, "weight_sync", "auto")
    if args.update_weight_disk_dir:
        disk_folder = Path(args.update_weight_disk_dir)
    if args.update_weight_mode == "delta":
        return delta_sync(args, engine, disk_folder, post_write)
    if mode == "auto":
        colocated = args.colocate and not getattr(args, "lora_rank", 0)  # an adapter goes through disk
        mode = "in_process" if engine.in_process_weights else "tensor" if colocated else "disk"
    if mode in ("tensor", "nccl") and mode not in engine.weight_transports:
        takes = ", ".join(sorted(engine.weight_transports | {"disk"}))
        raise ValueError(
            f"--weight-sync {mode}: {engine_label(engine)} cannot take weights that way; it takes {takes}"
            + (" and in_process" if engine.in_process_weights else "")
        )
    if mode == "tensor" and not args.colocate:
        raise ValueError(
            "--weight-sync tensor passes CUDA memory handles: it needs --colocate (engines on the "
            "trainer's GPUs); use --weight-sync nccl for engines on other GPUs"
        )
    if getattr(args, "lora_rank", 0) and mode in ("tensor", "nccl"):
        raise ValueError(
            f"--weight-sync {mode} sends whole weights; a LoRA run (--lora-rank) syncs its adapter in process "
            "(embedded engine) or through disk (--weight-sync auto or disk)"
        )
    if mode == "in_process" and not engine.in_process_weights:
        raise ValueError(f"{type(engine).__name__} cannot take weights in process")
    if post_write is not None and mode != "disk":
        raise ValueError(
            f"{post_write.describe()} (--custom-update-weight-post-write-path) runs after a disk weight sync "
            f"wrote its files; this run syncs {mode}: pass --weight-sync disk, or drop the hook"
        )
    if mode == "tensor":
        return ColocatedTensorSync(release=offloads(args)[1], bucket_bytes=args.update_weight_buffer_size)
    if mode == "disk":
        if post_write is None:
            return DiskSync(disk_folder)
        hook = post_write
        return DiskSync(
            disk_folder, lambda folder, engines: call_update_weight_post_write(hook, args, folder, engines)
        )
    if mode == "nccl":
        return NcclBroadcastSync(bucket_bytes=args.update_weight_buffer_size)
    return InProcessSync()


def delta_sync(
    args: RolloutConfig, engine: InferenceEngine, disk_folder: Path, post_write: Resolved | None
) -> DeltaDiskSync:
    """``update_weight_mode delta``: versions under ``disk_folder`` (``update_weight_disk_dir``), each
    engine's local checkpoint in ``update_weight_local_checkpoint_dir`` (default beside it), based on the
    engine's starting checkpoint (``hf_checkpoint``, else ``model``)."""
    from .delta_sync import DeltaPublisher  # numpy, torch, safetensors, zstandard: where a delta sync runs

    if getattr(args, "lora_rank", 0):
        raise ValueError("update_weight_mode delta sends whole weights; a LoRA run syncs its adapter (disk)")
    base = args.hf_checkpoint or args.model
    if not base or not Path(base).is_dir():
        raise ValueError(
            "update_weight_mode delta diffs against the engines' starting checkpoint: give its folder "
            f"(--hf-checkpoint), got {base!r}"
        )
    folder = disk_folder
    local = (
        Path(args.update_weight_local_checkpoint_dir)
        if args.update_weight_local_checkpoint_dir
        else folder.with_name(folder.name + "-local")
    )
    publisher = DeltaPublisher(
        folder, Path(base), args.update_weight_delta_encoding, args.update_weight_delta_checksum
    )
    hook = post_write
    write = (
        None if hook is None else (lambda f, engines: call_update_weight_post_write(hook, args, f, engines))
    )
    return DeltaDiskSync(publisher, local, write)


async def sync_weights(
    engine: InferenceEngine,
    trainer: PolicyTrainer,
    weight_version: str,
    strategy: WeightSync,
    timeout: float | None = None,
) -> float:
    """Give the engine the trainer's weights as ``weight_version``; returns the seconds it took. A push
    not done within ``timeout`` seconds is abandoned with a :class:`WeightSyncTimeout` naming the engine
    and the transport; an engine pool (several replicas) gets twice as long, since it replaces a replica
    that misses ``timeout`` itself."""
    started = time.perf_counter()
    push = asyncio.ensure_future(strategy.push(engine, trainer, weight_version))
    limit = None if timeout is None else timeout if engine.replicas() == [engine] else 2 * timeout
    done, _ = await asyncio.wait({push}, timeout=limit)
    if not done:
        push.cancel()  # not awaited: a push stuck where cancelling cannot reach must not hold the run
        raise WeightSyncTimeout(
            f"the weight sync of version {weight_version} to {engine_label(engine)} over the "
            f"{strategy.name} transport did not complete within {limit:g}s (--weight-sync-timeout): the "
            "engine is treated as dead"
        )
    push.result()
    return time.perf_counter() - started


def engine_label(engine: InferenceEngine) -> str:
    """The engine as an error names it: its class, and its URL or model where it has one."""
    where = engine.url or getattr(engine, "model_path", None)
    return f"{type(engine).__name__} ({where})" if where else type(engine).__name__


DEFAULT_SYNC_TIMEOUT = 300.0
"""Seconds a weight sync may take when the model's size is unknown."""


def default_sync_timeout(args: RolloutConfig) -> float:
    """``--weight-sync-timeout``, else 120 s plus 60 s per GiB of the model folder's weight files (a GGUF
    file counts four times: it is dequantized); :data:`DEFAULT_SYNC_TIMEOUT` when no folder is named."""
    if args.weight_sync_timeout:
        return float(args.weight_sync_timeout)
    folder = named_model_folder(args)
    if folder is None:
        return DEFAULT_SYNC_TIMEOUT
    size = sum(
        f.stat().st_size * (4 if f.suffix == ".gguf" else 1)
        for f in folder.iterdir()
        if f.suffix in (".safetensors", ".bin", ".pt", ".gguf")
    )
    return 120.0 + 60.0 * size / 2**30


class SyncTimes:
    """The run's weight-sync seconds: a sync taking more than twice the median of the earlier ones (and
    over :attr:`floor` seconds) is a warning, as slime's syncs grew 143 s -> 363 s -> 966 s unnoticed."""

    floor = 1.0

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def add(self, seconds: float, transport: str) -> str | None:
        """Record one sync; returns the warning's text when it grew, else None."""
        earlier = sorted(self.seconds)
        self.seconds.append(seconds)
        if not earlier or seconds <= self.floor:
            return None
        middle = len(earlier) // 2
        median = earlier[middle] if len(earlier) % 2 else (earlier[middle - 1] + earlier[middle]) / 2
        if seconds <= 2 * median:
            return None
        return (
            f"weight sync {len(self.seconds)} ({transport}) took {seconds:.1f}s, more than twice the median "
            f"{median:.1f}s of the run's {len(earlier)} earlier syncs: a growing sync ends in a timeout "
            "(--weight-sync-timeout)"
        )


async def engine_log_probs(engine: InferenceEngine, sample: Sample) -> list[float]:
    """The engine's log-probs (temperature 1) of ``sample``'s response tokens under its current weights.

    SGLang gives no log-prob for the first token of the range it scores (``None``): the range starts one
    token before the response."""
    payload = {
        "input_ids": list(sample.tokens),
        "return_logprob": True,
        "logprob_start_len": sample.prompt_length - 1,
        "sampling_params": {"max_new_tokens": 0, "temperature": 1.0},
    }
    response = await engine.generate(payload)
    assert isinstance(response, dict)
    entries = (response.get("meta_info", {}).get("input_token_logprobs") or [])[1:]
    if len(entries) != sample.response_length or any(entry[0] is None for entry in entries):
        raise WeightSyncError(
            f"trust check: the engine returned {len(entries)} log-probs (after the range's first) for a "
            f"probe of {sample.response_length} response tokens (does it support logprob_start_len?)"
        )
    return [float(entry[0]) for entry in entries]


@dataclass
class TrustProbe:
    """A probe sample with the trainer's log-probs of its response under the weights just synced: every
    engine serving those weights must give the same within ``tolerance``. An engine pool keeps the last
    one passed, to check an engine it restarts before it rejoins."""

    sample: Sample
    expected: list[float]
    tolerance: float

    async def gap(self, engine: InferenceEngine) -> float:
        """The largest |engine - trainer| log-prob."""
        if self.sample.response_length == 0:
            return 0.0
        served = await engine_log_probs(engine, self.sample)
        return max(abs(a - b) for a, b in zip(served, self.expected, strict=True))

    async def check(self, engine: InferenceEngine) -> float:
        """:meth:`gap`; above the tolerance a :class:`WeightSyncError`."""
        diff = await self.gap(engine)
        if not diff <= self.tolerance:
            probe, name = self.sample, getattr(engine, "name", "the engine")
            raise WeightSyncError(
                f"trust check failed after the weight sync: {name}'s log-probs for a probe sample (group "
                f"{probe.group_index}, index {probe.index}, {probe.response_length} response tokens) differ "
                f"from the trainer's by up to {diff:.4g} nats (tolerance --sync-check-tol {self.tolerance}): "
                "the engine is serving other weights than the trainer's"
            )
        return diff


FLOAT32_CHECK_TOL = 0.05
CUDA_CHECK_TOL = 2.0
"""The trust check's default tolerances (nats). On CPU the engine and the trainer both compute in float32
and agree to about 1e-4 per token, so 0.05 still catches one missed step. On CUDA the engine serves in
bfloat16 (SGLang's default, the embedded engine's): a logit of 20-30 is rounded to steps of 0.125 and its
fused kernels (attention, norms, log-softmax) round differently from the trainer's at every layer, so
with identical weights the two disagree on the odd token of a sampled response, more as the policy sharpens:
over 80-step GRPO runs of SmolLM2-135M on an H100 (benchmarks/README.md) the largest gap was 0.07-0.43 nats
in the first steps and up to 1.22 (torch trainer) and 1.34 (megatron) later. On CUDA the check therefore
catches weights that are missing, misplaced or from another model (several nats and more), not one missed
step (0.14-0.16 nats after a step at lr 1e-5)."""


def trains_on_gpu(trainer: PolicyTrainer) -> bool:
    """Whether the trainer runs on CUDA: its ``device``, else its ``dtype`` (half precision or not)."""
    device, dtype = str(getattr(trainer, "device", "")), str(getattr(trainer, "dtype", ""))
    return device.startswith("cuda") or dtype.endswith(("bfloat16", "float16"))


def check_tolerance(args: RolloutConfig, trainer: PolicyTrainer) -> float:
    """``sync_check_tol``, or its default for where the trainer runs (:func:`trains_on_gpu`)."""
    if args.sync_check_tol is not None:
        return float(args.sync_check_tol)
    return CUDA_CHECK_TOL if trains_on_gpu(trainer) else FLOAT32_CHECK_TOL


async def trust_check(
    engine: InferenceEngine, trainer: PolicyTrainer, probe: Sample, tolerance: float, enforce: bool = True
) -> float:
    """The largest |engine - trainer| log-prob over ``probe``'s response tokens, for each of the engine's
    replicas; above ``tolerance`` a :class:`WeightSyncError`, or only a warning without ``enforce`` (the
    weights are known to be the trainer's: the gap is numeric noise). A replica that dies meanwhile is left
    out."""
    expected = []
    if probe.response_length:
        expected = (await asyncio.to_thread(trainer.response_log_probs, [probe]))[0]
    checked = TrustProbe(probe, expected, tolerance)
    diffs = []
    for replica in engine.replicas():
        try:
            diffs.append(await (checked.check if enforce else checked.gap)(replica))
        except ReplicaLostError as exc:  # its pool checks it against this probe before it rejoins
            log.warning("trust check: %s", exc)
    if not enforce and max(diffs, default=0.0) > tolerance:
        log.warning(
            "the engine and the trainer hold identical weights (compared by checksum), yet their log-probs "
            "of a probe differ by up to %.3g nats (over --sync-check-tol %g): numeric differences of their "
            "kernels, not a failed sync",
            max(diffs),
            tolerance,
        )
    engine.remember_trust_probe(checked)
    return max(diffs, default=0.0)
