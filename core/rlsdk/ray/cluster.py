"""Joining or starting the Ray cluster of a run, and starting actors on it with a deadline each.

Every actor start is two waits: to be placed on a node and have its process up (:meth:`where`, which
answers with the node, process and log file), then to start its work (load a model, say). Each wait has the
run's ``ray_start_timeout``; missing it stops the run with the node, device, port and log file of the
actor (or, when it was never placed, the resources it asked for and what the cluster has free).
"""

from __future__ import annotations

import asyncio
import glob
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import RlsdkError
from ..plugins.manager import get_plugin_manager
from ..config import RolloutConfig

LOCAL = "local"
"""``--ray`` without an address: a cluster on this machine, for this run only."""


class ActorStartError(RlsdkError):
    """An actor was not placed, did not start in time, or failed while starting."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RlsdkError("--ray needs Ray: pip install 'rlsdk[ray]'") from None
    return ray


@dataclass
class Cluster:
    """The run's connection to Ray: ``connected`` when the run made it (and ends it: a local cluster
    stops, a joined one loses this run's actors); False when the caller was connected already."""

    address: str
    connected: bool

    def close(self) -> None:
        if self.connected:
            import_ray().shutdown()


def connect(args: RolloutConfig, local_cpus: int) -> Cluster:
    """``ray.init`` for the run: a local cluster with the dashboard off and ``local_cpus`` logical CPUs
    (``args.ray_address`` ``local``), or the cluster at ``auto``/``ray://...``/``host:port``.
    ``args.ray_runtime_env`` becomes the job's runtime environment, so every worker gets it."""
    ray = import_ray()
    options: dict[str, Any] = {"runtime_env": args.ray_runtime_env or None, "log_to_driver": False}
    if ray.is_initialized():  # a caller (a test, a notebook) connected already: use that cluster
        return Cluster(address="existing", connected=False)
    if args.ray_address == LOCAL:
        ray.init(
            num_cpus=local_cpus,
            include_dashboard=False,
            object_store_memory=local_object_store(),
            **options,
        )
        return Cluster(address=LOCAL, connected=True)
    address = args.ray_address or LOCAL
    ray.init(address=address, **options)
    return Cluster(address=address, connected=True)


def local_object_store() -> int:
    """Bytes of shared memory for the object store of a local cluster (weights travel through it): a
    quarter of the memory, between 1 and 8 GiB."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(min(max(total // 4, 1 << 30), 8 << 30))


def worker_info() -> dict[str, Any]:
    """Where the calling Ray worker runs: node address and id, process id, log file, GPUs, and the rlsdk
    plugins its environment has (distribution -> version), found by its own plugin manager."""
    ray = import_ray()

    context = ray.get_runtime_context()
    pid = os.getpid()
    return {
        "node": ray.util.get_node_ip_address(),
        "node_id": context.get_node_id(),
        "pid": pid,
        "log_file": worker_log_file(pid),
        "gpus": [str(g) for g in ray.get_gpu_ids()],
        "plugins": get_plugin_manager().plugin_versions(),
    }


def logs_folder() -> str:
    """The logs folder of this node's Ray session."""
    try:
        from ray._private.worker import global_worker  # no public API names the session folder

        return os.path.join(global_worker.node.get_session_dir_path(), "logs")
    except (ImportError, AttributeError):
        return "/tmp/ray/session_latest/logs"


def worker_log_file(pid: int) -> str:
    """The file Ray writes this worker process's output to."""
    folder = logs_folder()
    found = glob.glob(os.path.join(folder, f"worker-*-{pid}.out"))
    return found[0] if found else os.path.join(folder, f"worker-*-{pid}.out")


def describe_place(info: dict[str, Any], *, device: str, port: int | None) -> str:
    """``node 10.0.0.5, pid 123, device cpu, port none, log /tmp/ray/.../worker-...out``."""
    gpus = f" (GPUs {','.join(info['gpus'])})" if info.get("gpus") else ""
    return (
        f"node {info['node']}, pid {info['pid']}, device {device}{gpus}, port {port or 'none'}, "
        f"log {info['log_file']}"
    )


def free_resources() -> str:
    ray = import_ray()
    free = ray.available_resources()
    return ", ".join(
        f"{k} {v:g}" for k, v in sorted(free.items()) if not k.startswith(("node:", "memory", "object_store"))
    )


async def place(actor: Any, where: Any, what: str, asked: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Wait until ``actor`` is placed and answers ``where`` (the reference of its ``where()`` call); the
    :func:`worker_info` it answers."""
    ray = import_ray()

    def unplaced() -> str:  # the free resources when the time is up
        return (
            f"{what} was not placed on any node within {timeout:g}s (ray_start_timeout): it asks for "
            f"{asked}; the cluster has free: {free_resources() or 'nothing'}. Ray's logs: {logs_folder()}"
        )

    try:
        return await _answer(actor, where, timeout, unplaced)
    except ray.exceptions.RayError as exc:
        raise ActorStartError(
            f"{what} died before it started: {first_line(exc)}. Ray's logs: {logs_folder()}"
        ) from None


async def start(actor: Any, what: str, place_text: str, call: Any, timeout: float) -> Any:
    """Await ``call`` (the actor's start method) within ``timeout``; errors name where the actor runs."""
    ray = import_ray()
    started = time.perf_counter()
    try:
        return await _answer(
            actor,
            call,
            timeout,
            lambda: f"{what} did not start within {timeout:g}s (ray_start_timeout) on {place_text}",
        )
    except ray.exceptions.RayError as exc:
        ray.kill(actor)
        raise ActorStartError(
            f"{what} failed to start after {time.perf_counter() - started:.1f}s on "
            f"{place_text}: {first_line(exc)}"
        ) from None


async def _answer(actor: Any, ref: Any, timeout: float, late: Callable[[], str]) -> Any:
    """What ``ref`` (a call of ``actor``'s) answers within ``timeout``; past it the actor is killed, and
    ActorStartError says ``late()``."""
    try:
        return await asyncio.wait_for(_awaitable(ref), timeout)
    except TimeoutError:
        import_ray().kill(actor)
        raise ActorStartError(late()) from None


def first_line(exc: BaseException) -> str:
    """The error a Ray exception carries, without Ray's traceback banner and advice: the cause of a task's
    error, else the first sentence of Ray's message."""
    cause = getattr(exc, "cause", None)
    if cause is not None:
        return f"{type(cause).__name__}: {cause}"
    text = " ".join(str(exc).split())
    return text.split(". ")[0] if text else type(exc).__name__


async def _awaitable(ref: Any) -> Any:
    return await ref
