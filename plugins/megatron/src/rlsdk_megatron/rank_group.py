"""One trainer process per GPU, driven from the ``rlsdk run`` process.

The calling process is rank 0. :class:`RankGroup` starts ranks 1..N-1 as ``python -m
rlsdk_megatron.rank_group`` (each one's output in ``<log_dir>/megatron-rank-<r>.log``, stopped with rank 0
however it ends), and all join one ``torch.distributed`` group: NCCL on GPUs, gloo on CPU. Every rank
builds the same object from one factory and the same arguments; :meth:`RankGroup.call` then broadcasts
``(method, arguments)`` over a gloo group and runs the method on rank 0 while the other ranks run it too,
so the collectives inside it meet (:meth:`RankGroup.stream` does the same for a generator method, such as
the weights bucket by bucket). A rank that exits early is an error on rank 0 naming the rank and its
log, not a hang. :class:`RankGroupTrainer` is a :class:`rlsdk.trainer_api.PolicyTrainer` whose
every call goes through such a group.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rlsdk import Sample, load_callable
from rlsdk.trainer_api import ManagedProcess, PolicyTrainer, free_port

BACKEND_ENV = "RLSDK_DIST_BACKEND"
COLLECTIVE_TIMEOUT = timedelta(minutes=30)
IDLE_TIMEOUT = timedelta(days=7)
"""How long ranks 1..N-1 wait for rank 0's next call (a rollout step may take long)."""


class RankFailedError(RuntimeError):
    """A rank of the group exited or failed."""


def _join(rank: int, world_size: int, store: dist.TCPStore, backend: str) -> dist.ProcessGroup:
    """Join the default group and return the gloo group that carries the calls."""
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT
    )
    return dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)


class RankGroup:
    """Ranks 1..``world_size``-1 in subprocesses, each holding ``factory(args)``, as rank 0 does."""

    def __init__(
        self, factory: str, args: Any, world_size: int, log_dir: Path, startup_timeout: float = 900.0
    ) -> None:
        self.world_size = world_size
        self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        port = free_port()
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=True, wait_for_workers=False)
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(world_size),
            BACKEND_ENV: self.backend,
        }
        self.ranks = [
            ManagedProcess(
                f"megatron rank {rank}",
                [sys.executable, "-m", "rlsdk_megatron.rank_group"],
                log_dir / f"megatron-rank-{rank}.log",
                {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            )
            for rank in range(1, world_size)
        ]
        self.failure: str | None = None
        self._closing = False
        for process in self.ranks:
            process.start()
        try:
            self._wait_until_joined(store, startup_timeout)
            self.control = _join(0, world_size, store, self.backend)
            self._watchdog = threading.Thread(target=self._watch, name="megatron-ranks", daemon=True)
            self._watchdog.start()
            args = _picklable(args)
            self.target = self._everywhere("build", (factory, args), lambda: load_callable(factory)(args))
        except BaseException:
            self._stop()
            if dist.is_initialized():
                dist.destroy_process_group()
            raise

    def _wait_until_joined(self, store: dist.TCPStore, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        keys = [f"joined/{rank}" for rank in range(1, self.world_size)]
        while not store.check(keys):
            self._raise_if_exited()
            if time.monotonic() > deadline:
                raise RankFailedError(
                    f"rlsdk-megatron: ranks did not start within {timeout:.0f} s: {self._logs()}"
                )
            time.sleep(0.2)

    def call(self, method: str, *arguments: Any) -> Any:
        """Run ``method(*arguments)`` on every rank; returns rank 0's result."""
        return self._everywhere(method, arguments, lambda: getattr(self.target, method)(*arguments))

    def stream(self, method: str, *arguments: Any) -> Iterator[Any]:
        """Run generator ``method(*arguments)`` on every rank; yields rank 0's items. The other ranks run
        theirs to the end, and so does rank 0 when its consumer stops early (they take part in each item)."""
        items = self.call(method, *arguments)
        try:
            while True:
                try:
                    item = next(items)
                except StopIteration:
                    return
                except BaseException as exc:
                    self._failed(method, exc)
                    raise
                yield item
        finally:
            with contextlib.suppress(Exception):  # a failure above stopped the group already
                for _ in items:
                    pass

    def _everywhere(self, method: str, arguments: tuple[Any, ...], run_here: Any) -> Any:
        """Broadcast the call, then ``run_here()``. After a failure the group is stopped: the other ranks
        may wait in a collective rank 0 never reaches."""
        if self.failure:
            raise RankFailedError(self.failure)
        try:
            dist.broadcast_object_list([(method, arguments)], src=0, group=self.control)
            return run_here()
        except BaseException as exc:  # Ctrl-C included: the ranks would wait in the call forever
            self._failed(method, exc)
            raise

    def _failed(self, method: str, exc: BaseException) -> None:
        """Stop the group after rank 0's ``method`` raised ``exc`` (a rank's exit, when one is seen, raises
        :class:`RankFailedError` naming it instead)."""
        if isinstance(exc, Exception):
            time.sleep(1.0)  # a failed collective is often a rank's death the watchdog is about to see
            self._raise_if_exited()
        self.failure = f"rlsdk-megatron: {method} failed on rank 0 ({exc!r}); the ranks were stopped"
        self._stop()

    def close(self) -> None:
        """Ranks 1..N-1 leave their loop; whatever has not exited after a while is stopped."""
        if self.failure is None and not self._closing:
            self._closing = True  # the ranks now exit: not a failure for the watchdog to stop the rest for
            # From a thread: a rank stuck elsewhere must not hold rank 0 here (it is stopped below).
            sender = threading.Thread(target=self._send_close, name="megatron-close", daemon=True)
            sender.start()
            sender.join(timeout=30.0)
            _close(self.target)
            deadline = time.monotonic() + 30.0
            while time.monotonic() < deadline and any(p.exit_code() is None for p in self.ranks):
                time.sleep(0.1)
        self._stop()
        if dist.is_initialized():
            dist.destroy_process_group()

    def _send_close(self) -> None:
        with contextlib.suppress(Exception):  # a rank died meanwhile: stopped by close()
            dist.broadcast_object_list([("close", ())], src=0, group=self.control)

    def _stop(self) -> None:
        self._closing = True
        for process in self.ranks:
            process.stop(grace=5.0)

    def _watch(self) -> None:
        """Rank 0's watch over the others: an early exit stops the rest and fails the group's calls."""
        while not self._closing:
            for rank, process in enumerate(self.ranks, start=1):
                code = process.exit_code()
                if code is not None and not self._closing:
                    self.failure = self._exit_message(rank, process, code)
                    self._stop()
                    if self.backend == "nccl":  # unblock rank 0's pending NCCL collectives
                        with contextlib.suppress(Exception):
                            dist.distributed_c10d._abort_process_group()
                    return
            time.sleep(0.5)

    def _raise_if_exited(self) -> None:
        for rank, process in enumerate(self.ranks, start=1):
            code = process.exit_code()
            if code is not None:
                self.failure = self.failure or self._exit_message(rank, process, code)
        if self.failure:
            self._stop()
            raise RankFailedError(self.failure)

    @staticmethod
    def _exit_message(rank: int, process: ManagedProcess, code: int) -> str:
        return (
            f"rlsdk-megatron: rank {rank} exited with status {code} (log {process.log_path}):\n"
            f"{process.log_tail()}"
        )

    def _logs(self) -> str:
        return ", ".join(str(p.log_path) for p in self.ranks)


def _close(target: Any) -> None:
    """The built object's own ``close()``, where it has one (collective, like every call)."""
    if hasattr(target, "close"):
        target.close()


def _picklable(args: Any) -> Any:
    """``args`` without what a run binds to it (its runtime): only the dataclass fields travel."""
    if not dataclasses.is_dataclass(args):
        return args
    clone = object.__new__(type(args))
    for field in dataclasses.fields(args):
        object.__setattr__(clone, field.name, getattr(args, field.name))
    return clone


def serve() -> None:
    """Ranks 1..N-1: join, build the factory's object, then run rank 0's calls until it closes the group."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False
    )
    store.set(f"joined/{rank}", "1")
    control = _join(rank, world_size, store, os.environ[BACKEND_ENV])
    target: Any = None
    while True:
        message: list[Any] = [None]
        dist.broadcast_object_list(message, src=0, group=control)
        method, arguments = message[0]
        if method == "close":
            _close(target)
            break
        if method == "build":
            factory, args = arguments
            target = load_callable(factory)(args)
        else:
            result = getattr(target, method)(*arguments)
            if inspect.isgenerator(result):  # a stream: this rank's part of every item
                for _ in result:
                    pass
    dist.destroy_process_group()


class RankGroupTrainer(PolicyTrainer):
    """A trainer of ``world_size`` processes: ``factory(args)`` on each, every call made on all of them."""

    def __init__(self, factory: str, args: Any, world_size: int, log_dir: Path) -> None:
        self.group = RankGroup(factory, args, world_size, log_dir)
        self.local = self.group.target
        """Rank 0's trainer."""
        self.device, self.dtype = self.local.device, self.local.dtype

    def train_step(self, rollout_id: int, groups: list[list[Sample]]) -> dict[str, float]:
        return self.group.call("train_step", rollout_id, groups)

    def response_log_probs(self, samples: list[Sample]) -> list[list[float]]:
        return self.group.call("response_log_probs", samples)

    def weights(self) -> Mapping[str, Any]:
        return self.group.call("weights")

    def weight_buckets(self, bucket_bytes: int) -> Iterator[dict[str, Any]]:
        return self.group.stream("weight_buckets", bucket_bytes)

    def save_hf_model(self, folder: Path) -> None:
        self.group.call("save_hf_model", folder)

    def save_checkpoint(self, folder: Path) -> None:
        self.group.call("save_checkpoint", folder)

    def load_checkpoint(self, folder: Path) -> None:
        self.group.call("load_checkpoint", folder)

    def offload(self) -> None:
        self.group.call("offload")

    def onload(self) -> None:
        self.group.call("onload")

    def close(self) -> None:
        self.group.close()


if __name__ == "__main__":
    serve()
