"""Futures and ordering, as the Tinker SDK expects them.

Every training and sampling request is answered at once with a request id; the client then long-polls
``/api/v1/retrieve_future`` until the result is there (:class:`Futures`). The requests of one training model
carry consecutive ``seq_id`` numbers and run in that order, one at a time, whatever order they arrive in
(the SDK sends a batch's chunks concurrently, the first last): :class:`Sequencer`. A submission the SDK
retries (it retries on 408, 409, 429 and 5xx, and on lost connections) names the same ``seq_id`` and gets
the same request id back, so nothing runs twice.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

LONG_POLL_SECONDS = 40.0
"""How long a ``retrieve_future`` waits for a result before answering ``try_again`` (the SDK's poll has a
45 s timeout)."""
KEEP_RETRIEVED_SECONDS = 600.0
"""How long a result stays after it was first retrieved, for a client that retries the retrieval."""
MAX_FINISHED = 10_000
"""Finished results kept at most; the oldest retrieved ones go first."""


class UserError(ValueError):
    """A request that cannot be served as asked (the client's to fix): its future fails with category
    ``user``; any other exception fails it with category ``server``."""


@dataclass
class Entry:
    owner: str
    kind: str
    future: asyncio.Future[Any]
    retrieved_at: float | None = None
    finished_at: float | None = None


@dataclass
class Futures:
    """Request id -> result (a JSON-able dict, protobuf bytes, or an exception), per API-key owner."""

    entries: dict[str, Entry] = field(default_factory=dict)

    def create(self, owner: str, kind: str) -> tuple[str, asyncio.Future[Any]]:
        request_id = f"req-{secrets.token_urlsafe(12)}"
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        entry = Entry(owner, kind, future)
        future.add_done_callback(lambda _: setattr(entry, "finished_at", time.monotonic()))
        self.entries[request_id] = entry
        self._trim()
        return request_id, future

    def run(self, owner: str, kind: str, work: Awaitable[Any]) -> str:
        """A request id whose future is ``work``'s result."""
        request_id, future = self.create(owner, kind)
        task = asyncio.ensure_future(work)
        task.add_done_callback(lambda done: _settle(future, done))
        return request_id

    def get(self, owner: str, request_id: str) -> Entry | None:
        entry = self.entries.get(request_id)
        return entry if entry is not None and entry.owner == owner else None

    async def wait(self, entry: Entry, timeout: float = LONG_POLL_SECONDS) -> bool:
        """Whether ``entry`` finished within ``timeout`` seconds (marked retrieved then)."""
        if not entry.future.done():
            await asyncio.wait({entry.future}, timeout=timeout)
        if not entry.future.done():
            return False
        entry.retrieved_at = entry.retrieved_at or time.monotonic()
        return True

    def fail_pending(self, owner_of: Callable[[Entry], bool], error: Exception) -> None:
        for entry in self.entries.values():
            if owner_of(entry) and not entry.future.done():
                entry.future.set_exception(error)

    def _trim(self) -> None:
        now = time.monotonic()
        stale = [
            rid
            for rid, e in self.entries.items()
            if e.retrieved_at is not None and now - e.retrieved_at > KEEP_RETRIEVED_SECONDS
        ]
        for rid in stale:
            del self.entries[rid]
        if len(self.entries) > MAX_FINISHED:
            finished = sorted(
                (e.retrieved_at is None, e.finished_at or 0.0, rid)
                for rid, e in self.entries.items()
                if e.future.done()
            )
            for _, _, rid in finished[: len(self.entries) - MAX_FINISHED]:
                del self.entries[rid]


def _settle(future: asyncio.Future[Any], done: asyncio.Future[Any]) -> None:
    if future.done():
        return
    if done.cancelled():
        future.set_exception(RuntimeError("the request was cancelled (the session ended)"))
    elif (error := done.exception()) is not None:
        future.set_exception(error)
    else:
        future.set_result(done.result())


Operation = Callable[[], Awaitable[Any]]


@dataclass
class Sequencer:
    """Runs one model's operations in ``seq_id`` order, one at a time; a seq_id seen before returns the
    request id it got then."""

    next_seq: int = 1
    waiting: dict[int, tuple[Operation, asyncio.Future[Any]]] = field(default_factory=dict)
    request_ids: dict[int, str] = field(default_factory=dict)
    runner: asyncio.Task[None] | None = None

    def submit(
        self, futures: Futures, owner: str, kind: str, seq_id: int | None, operation: Operation
    ) -> str:
        if seq_id is None:  # an SDK that numbers nothing: after everything known
            seq_id = max([self.next_seq - 1, *self.request_ids, *self.waiting]) + 1
        if seq_id in self.request_ids:
            return self.request_ids[seq_id]
        if seq_id < self.next_seq:
            raise UserError(
                f"seq_id {seq_id} is behind this model's next request ({self.next_seq}) and was never "
                "submitted: requests of a model run in seq_id order"
            )
        request_id, future = futures.create(owner, kind)
        self.request_ids[seq_id] = request_id
        self.waiting[seq_id] = (operation, future)
        if self.runner is None or self.runner.done():
            self.runner = asyncio.ensure_future(self._run())
        return request_id

    async def _run(self) -> None:
        while self.next_seq in self.waiting:
            operation, future = self.waiting.pop(self.next_seq)
            self.next_seq += 1
            try:
                result = await operation()
            except asyncio.CancelledError:
                future.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 -- the future carries it to the client
                if not isinstance(exc, UserError):
                    log.exception("a training request failed")
                future.set_exception(exc)
            else:
                future.set_result(result)
        self._forget_old()

    def _forget_old(self, keep: int = 4096) -> None:
        """Request ids of long-finished seq_ids (a retry arrives within seconds, not thousands of requests)."""
        for seq in [s for s in self.request_ids if s < self.next_seq - keep]:
            del self.request_ids[seq]

    def cancel(self, error: Exception) -> None:
        for _, future in self.waiting.values():
            if not future.done():
                future.set_exception(error)
        self.waiting.clear()
        if self.runner is not None:
            self.runner.cancel()
