"""Worker processes for CPU-heavy grading, with a wall-clock timeout per task that cannot be missed.

math-verify and sympy time out with ``signal.alarm``, which only works on a process's main thread, and
some big-integer arithmetic never returns to the interpreter at all. So every task runs on the main
thread of a worker process under a ``SIGALRM`` timer, and the parent kills and replaces a worker that
does not answer within the timeout plus a short grace. Workers are fresh interpreters
(``python -m rlsdk_rm_hub.pool``), not forks: nothing of the parent's threads or locks is inherited and the
caller's ``__main__`` is never re-imported, so no ``if __name__ == "__main__"`` guard is needed. They start
on first use (one ahead of it with :meth:`GraderPool.warm`) and say when their imports are done, so
start-up never counts against a task's timeout.
One pool per process is shared (:func:`get_pool`); it is safe to use from any thread and any event loop,
and shut down at exit.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import importlib
import os
import signal
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

from rlsdk import TaskPool, cluster_task_pool

WARM_UP = ["rlsdk_rm_hub.math_worker:warm_up"]
"""Functions every worker runs (imports, first-call caches) before it reports ready."""
STARTUP_TIMEOUT_S = 120.0
"""How long a new worker may take to import its modules."""
KILL_GRACE_S = 0.5
"""How long the parent waits past the timeout before it kills a worker that did not answer."""


class GradingTimeout(BaseException):
    """Raised inside a worker when its timer fires; a BaseException so a grader's ``except Exception``
    (math-verify swallows errors into ``False``) cannot turn a timeout into a silent wrong answer."""


class WorkerError(RuntimeError):
    """A task failed in a worker: it raised, timed out, or the worker died."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise GradingTimeout


def _load(funcs: dict[str, Any], spec: str) -> Any:
    if spec not in funcs:
        module, _, name = spec.partition(":")
        funcs[spec] = getattr(importlib.import_module(module), name)
    return funcs[spec]


def _worker_main(conn: Any) -> None:
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    funcs: dict[str, Any] = {}
    for spec in WARM_UP:
        _load(funcs, spec)()
    conn.send("ready")
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        spec, args, timeout = message
        try:
            func = _load(funcs, spec)
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                result = func(*args)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            reply = (True, result)
        except GradingTimeout:
            reply = (False, f"timed out after {timeout:g}s")
        except Exception as exc:  # reported to the parent, which marks the sample invalid
            reply = (False, f"{type(exc).__name__}: {exc}")
        conn.send(reply)


class _Worker:
    """One worker interpreter talking over two pipes."""

    def __init__(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rlsdk_rm_hub.pool", str(to_child_r), str(from_child_w)],
            pass_fds=(to_child_r, from_child_w),
            stdin=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self.send_conn = Connection(to_child_w, readable=False)
        self.recv_conn = Connection(from_child_r, writable=False)
        if not self.recv_conn.poll(STARTUP_TIMEOUT_S) or self.recv_conn.recv() != "ready":
            self.kill()
            raise WorkerError(f"a grading worker did not start within {STARTUP_TIMEOUT_S:g}s")

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self._close()

    def _close(self) -> None:
        self.send_conn.close()
        self.recv_conn.close()

    def stop(self) -> None:
        try:
            self.send_conn.send(None)
            self.process.wait(1)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        self._close()


class _DuplexConnection:
    """A worker's two pipe ends as one object with ``recv`` and ``send``."""

    def __init__(self, reader: Connection, writer: Connection) -> None:
        self.recv, self.send = reader.recv, writer.send


class _Slots:
    """A pool's slots: idle workers, and empty slots where a worker may start. An idle worker (the most
    recently used) is always taken before an empty slot, and a worker started ahead of use is waited for,
    so a new worker (1-3 s of imports) starts only when every started one is busy, also after a worker
    was killed."""

    def __init__(self, empty: int) -> None:
        self.idle: list[_Worker] = []
        self._empty = empty
        self._ahead = 0  # workers starting ahead of use (GraderPool.warm)
        self._changed = threading.Condition()

    def take(self) -> _Worker | None:
        """An idle worker, else None for an empty slot; waits while every slot is in use or while a
        worker started ahead of use is on its way."""
        with self._changed:
            self._changed.wait_for(lambda: self.idle or (self._empty and not self._ahead))
            if self.idle:
                return self.idle.pop()
            self._empty -= 1
            return None

    def take_ahead(self) -> bool:
        """An empty slot for a worker started ahead of use; False when a worker is idle or no slot is empty."""
        with self._changed:
            if self.idle or not self._empty:
                return False
            self._empty -= 1
            self._ahead += 1
            return True

    def give(self, worker: _Worker | None, ahead: bool = False) -> None:
        """Hand a slot back: its worker, or None when it has none (never started, killed or stopped);
        ``ahead`` for the slot of :meth:`take_ahead`."""
        with self._changed:
            if ahead:
                self._ahead -= 1
            if worker is None:
                self._empty += 1
            else:
                self.idle.append(worker)
            self._changed.notify_all()

    def take_idle(self) -> list[_Worker]:
        """Every idle worker, their slots left empty."""
        with self._changed:
            idle, self.idle = self.idle, []
            self._empty += len(idle)
            return idle


class GraderPool:
    """``processes`` worker processes running ``"module:function"`` tasks with a timeout each."""

    def __init__(self, processes: int) -> None:
        if processes < 1:
            raise ValueError(f"a grader pool needs at least one process, got {processes}")
        self.processes = processes
        self._slots = _Slots(processes)  # a worker is started on first use
        self._waiters = concurrent.futures.ThreadPoolExecutor(
            2 * processes, thread_name_prefix="rlsdk-grader"
        )
        self._closed = False
        self._warming = threading.Lock()  # held for good by the first warm()

    def run(self, spec: str, args: tuple[Any, ...], timeout: float) -> Any:
        """Run ``spec(*args)`` in a worker and return its result; raise WorkerError on failure."""
        if self._closed:
            raise WorkerError("the grader pool is shut down")
        worker = self._slots.take()
        try:
            if self._closed:  # shut down while this task waited for a slot
                raise WorkerError("the grader pool is shut down")
            if worker is None:
                worker = _Worker()
            try:
                worker.send_conn.send((spec, args, timeout))
                if not worker.recv_conn.poll(timeout + KILL_GRACE_S):
                    worker.kill()
                    worker = None
                    raise WorkerError(f"timed out after {timeout:g}s (worker killed)")
                ok, value = worker.recv_conn.recv()
            except (EOFError, OSError) as exc:
                code = worker.process.poll() if worker is not None else None
                if worker is not None:
                    worker.kill()
                worker = None
                raise WorkerError(f"the grading worker died (exit code {code}): {exc!r}") from None
            if not ok:
                raise WorkerError(value)
            return value
        finally:
            if self._closed and worker is not None:
                worker.stop()
                worker = None
            self._slots.give(worker)

    def warm(self) -> None:
        """Start one worker in the background, once per pool (later calls return at once), so that the
        first task finds it ready instead of waiting seconds for its imports."""
        # the slot is taken here, so a task sent next waits for this worker; nothing to do when a task
        # started one first. A daemon thread: exiting never waits for the imports.
        if self._warming.acquire(blocking=False) and self._slots.take_ahead():
            threading.Thread(target=self._start_ahead, name="rlsdk-grader-warm", daemon=True).start()

    def _start_ahead(self) -> None:
        worker = None
        try:
            if not self._closed:
                worker = _Worker()
        except (WorkerError, OSError):
            pass  # the first task will start one and report why it cannot
        finally:
            if self._closed and worker is not None:
                worker.stop()
                worker = None
            self._slots.give(worker, ahead=True)

    def submit(self, spec: str, args: tuple[Any, ...], timeout: float) -> concurrent.futures.Future[Any]:
        """Run a task without blocking the caller; the future works from threads and (wrapped) event loops."""
        return self._waiters.submit(self.run, spec, args, timeout)

    async def arun(self, spec: str, args: tuple[Any, ...], timeout: float) -> Any:
        return await asyncio.wrap_future(self.submit(spec, args, timeout))

    def shutdown(self) -> None:
        """Stop the idle workers; busy ones stop when their task ends."""
        self._closed = True
        self._waiters.shutdown(wait=False, cancel_futures=True)
        for worker in self._slots.take_idle():
            worker.stop()


_pool: GraderPool | None = None
_pool_lock = threading.Lock()


@functools.cache  # os.cpu_count() reads /sys each time, and reward calls ask on every sample
def default_processes() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def get_pool(processes: int | None = None) -> GraderPool | TaskPool:
    """The cluster's pool while the run is on Ray (:func:`rlsdk.aio.task_pools.cluster_task_pool`), else the
    process-wide pool, created on first use; asking for another size replaces it."""
    global _pool
    cluster = cluster_task_pool()
    if cluster is not None:
        return cluster
    processes = processes or default_processes()
    with _pool_lock:
        if _pool is None or _pool.processes != processes:
            if _pool is not None:
                _pool.shutdown()
            _pool = GraderPool(processes)
        return _pool


@atexit.register
def shutdown_pool() -> None:
    """Stop the shared pool's workers (also run at interpreter exit)."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.shutdown()
            _pool = None


if __name__ == "__main__":  # a worker: python -m rlsdk_rm_hub.pool <read fd> <write fd>
    _worker_main(
        _DuplexConnection(
            Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False)
        )
    )
