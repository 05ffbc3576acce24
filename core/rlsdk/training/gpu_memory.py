"""Peak GPU memory per phase of an RL step (rollout, train, sync), over the whole device: the trainer's
and the colocated engines' allocations together, read from the driver (``torch.cuda.mem_get_info``) by a
thread every few milliseconds. An engine's memory lives in its own process, so the trainer's allocator
statistics alone would miss it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

DEFAULT_PHASE = "rollout"
"""What the device does outside the trainer's phases: the engines generate."""


class PhasePeaks:
    """Samples the used memory of ``device`` (a CUDA device) every ``interval`` seconds; :meth:`phase`
    names what runs meanwhile, :meth:`take` returns and resets each phase's peak in GB."""

    def __init__(self, device: Any, interval: float = 0.005) -> None:
        self.device = device
        self.interval = interval
        self.current = DEFAULT_PHASE
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._sample, name="gpu-memory", daemon=True)
        self._thread.start()

    def _used_gb(self) -> float:
        import torch

        free, total = torch.cuda.mem_get_info(self.device)
        return (total - free) / 1e9

    def _record(self) -> None:
        used = self._used_gb()
        with self._lock:
            self.peaks[self.current] = max(self.peaks.get(self.current, 0.0), used)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self._record()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._record()  # the previous phase's last reading
        with self._lock:
            self.current = name
        try:
            yield
        finally:
            self._record()
            with self._lock:
                self.current = DEFAULT_PHASE

    def take(self) -> dict[str, float]:
        """``{phase: peak GB}`` since the last call."""
        self._record()
        with self._lock:
            peaks, self.peaks = self.peaks, {}
        return peaks

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)


def phase_peaks_for(trainer: Any) -> PhasePeaks | None:
    """A sampler of the trainer's CUDA device, or None for a trainer elsewhere."""
    device = getattr(trainer, "device", None)
    return PhasePeaks(device) if getattr(device, "type", None) == "cuda" else None
