"""Peak GPU memory per phase of an RL step (``memory/peak_gpu_gb_<phase>``). The driver's reading
(``torch.cuda.mem_get_info``) needs a GPU, which CI has not: here it is replaced by a function of what the
test sets, so the sampler thread, the phase attribution and the reset between steps are what is checked
(benchmarks/gpu/scale.py reads the real driver on an H100)."""

from __future__ import annotations

import time

import pytest
import torch

from rlsdk.training.gpu_memory import PhasePeaks, phase_peaks_for


def seen(peaks: PhasePeaks, phase: str, gb: float) -> None:
    """Wait until the sampler thread has read ``gb`` during ``phase`` (a few milliseconds; 10 s at most)."""
    deadline = time.monotonic() + 10
    while peaks.peaks.get(phase) != pytest.approx(gb):
        assert time.monotonic() < deadline, f"the sampler never read {gb} GB during {phase}"
        time.sleep(0.001)


def test_each_phase_keeps_its_own_peak_and_take_resets(monkeypatch):
    used = {"bytes": 10e9}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80e9 - used["bytes"], 80e9))
    peaks = PhasePeaks("cuda:0", interval=0.001)
    try:
        used["bytes"] = 30e9  # the engines generate
        seen(peaks, "rollout", 30.0)
        with peaks.phase("train"):
            used["bytes"] = 50e9  # a peak between two phase boundaries: only the thread sees it
            seen(peaks, "train", 50.0)
            used["bytes"] = 20e9
        with peaks.phase("sync"):
            used["bytes"] = 25e9
            seen(peaks, "sync", 25.0)
        first = peaks.take()
        assert first == pytest.approx({"rollout": 30.0, "train": 50.0, "sync": 25.0})
        assert peaks.take() == pytest.approx({"rollout": 25.0})  # a new step starts from what is used now
    finally:
        peaks.close()


def test_no_sampler_for_a_trainer_off_the_gpu():
    class OnCpu:
        device = torch.device("cpu")

    assert phase_peaks_for(OnCpu()) is None
