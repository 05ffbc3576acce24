"""A request to stop a run gracefully (SIGTERM, SIGINT), set from any thread and seen by async code."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class StopRequest:
    """Set once (by a signal handler, say); async code waiting on an event registered with :meth:`watch`
    wakes up on its own loop."""

    def __init__(self) -> None:
        self._set = threading.Event()
        self._lock = threading.Lock()
        self._watchers: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self.reason = ""
        """What asked for the stop (``SIGTERM``, ``SIGINT``)."""

    @property
    def is_set(self) -> bool:
        return self._set.is_set()

    def set(self, reason: str) -> None:
        with self._lock:
            if self._set.is_set():
                return
            self.reason = reason
            self._set.set()
            watchers = list(self._watchers)
        for loop, event in watchers:
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)

    @contextmanager
    def watch(self, event: asyncio.Event) -> Iterator[None]:
        """Set ``event`` (an event of the running loop) when the stop is requested, while the block runs."""
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            self._watchers.append(entry)
            if self._set.is_set():
                event.set()
        try:
            yield
        finally:
            with self._lock:
                self._watchers.remove(entry)
