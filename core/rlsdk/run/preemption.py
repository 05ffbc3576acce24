"""Graceful stops: SIGTERM (what a cluster scheduler sends before it preempts a job) and SIGINT ask the run
to stop; the rollout in flight is aborted with its tokens kept, a checkpoint is written, and ``--resume``
continues from there. A second signal stops at once, as the signal would without rlsdk."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..aio.stopping import StopRequest

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RunStopped(Exception):
    """The run stopped on request (``signal``) after saving its state; ``--resume`` continues it."""

    def __init__(self, signal_name: str, output_dir: Path) -> None:
        self.signal_name = signal_name
        self.output_dir = output_dir
        super().__init__(
            f"stopped on {signal_name}: state and checkpoint saved; continue with: "
            f"rlsdk run --resume --output {output_dir}"
        )

    @property
    def exit_code(self) -> int:
        """128 plus the signal's number, as a shell reports a process the signal ended."""
        return 128 + int(getattr(signal, self.signal_name, signal.SIGTERM))


@contextmanager
def stop_on_signals(stop: StopRequest) -> Iterator[None]:
    """While the block runs (in the main thread; elsewhere nothing is installed), the first SIGTERM or
    SIGINT sets ``stop``; the handlers in place before come back then, so a second signal acts as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def on_signal(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        restore()
        print(
            f"{name}: stopping after the step in progress is saved (the rollout in flight is aborted, its "
            f"tokens kept); {name} again stops at once",
            file=sys.stderr,
            flush=True,
        )
        stop.set(name)

    for sig in STOP_SIGNALS:
        if previous[sig] is signal.SIG_IGN:  # a shell started us in the background: keep ignoring
            continue
        signal.signal(sig, on_signal)
    try:
        yield
    finally:
        restore()
