"""The rollout-loop benchmarks run end to end at a tiny size and print their JSON report last.
Shapes only: timings are never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def report(script: str, *options: str, timeout: float = 60) -> dict:
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *options], capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.plugins('rlsdk_filter_hub', 'rlsdk_embedded', 'rlsdk_rm_hub')
@pytest.mark.timeout(60)
def test_loop_overhead_reports_both_loops():
    out = report("loop_overhead.py", "--sizes", "16,64", "--samples", "64", "--latency", "0.01",
                 "--latency-samples", "16", "--latency-steps", "1")
    assert out["benchmark"] == "loop_overhead" and {"cpu", "python"} <= set(out["machine"])
    assert [row["step_samples"] for row in out["throughput"]] == [16, 64]
    for row in out["throughput"]:
        assert row["rlsdk_samples_per_s"] > 0 and row["baseline_samples_per_s"] > 0
    assert out["samples_per_s"] == max(r["rlsdk_samples_per_s"] for r in out["throughput"])
    assert out["ratio"] == pytest.approx(out["samples_per_s"] / out["baseline_samples_per_s"])
    assert out["latency"]["latency_s"] == 0.01 and "rlsdk_overhead_share" in out["latency"]
    assert isinstance(out["meets_target"], bool)


@pytest.mark.plugins('rlsdk_filter_hub', 'rlsdk_embedded', 'rlsdk_rm_hub')
@pytest.mark.timeout(60)
def test_long_tail_compares_sync_and_partial_without_losing_samples():
    out = report("long_tail.py", "--steps", "3", "--batch-size", "4", "--slots", "32", "--max-len", "512",
                 "--median-len", "100")
    assert out["benchmark"] == "long_tail" and out["inputs"]["time"] == "simulated"
    sync, partial = out["sync"], out["partial"]
    assert not sync["partial_rollout"] and partial["partial_rollout"]
    assert sync["over_sampling_batch_size"] == 4 and partial["over_sampling_batch_size"] == 8
    for mode in (sync, partial):
        assert mode["kept_samples"] == 3 * 4 * 8  # same kept batch in both modes
        assert mode["samples_lost"] == 0
        assert mode["tokens_generated"] == mode["tokens_kept"] + mode["tokens_in_buffer_at_end"] + mode["tokens_wasted"]
    assert out["ratio"] == pytest.approx(sync["step_s_mean"] / partial["step_s_mean"])


@pytest.mark.plugins('rlsdk_filter_hub', 'rlsdk_embedded', 'rlsdk_rm_hub')
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_agent_sessions_counts_forks_and_times_both_paths():
    # one session of two turns (the second continues the first), one timed latency turn after the warm-up
    out = report("agent_sessions.py", "--sessions", "1", "--turns", "2", "--latency-turns", "2", "--max-tokens", "2",
                 "--conversation-turns", "3", "--tool-tokens", "20", "--gen-tokens", "2", timeout=170)
    assert out["benchmark"] == "agent_sessions"
    assert out["false_forks"]["sessions"] == 1 and out["false_forks"]["turns"] == 2
    assert out["false_forks"]["forks"] == 0  # the agent never edits its history
    latency = out["latency"]
    assert latency["turns"] == 1 and latency["chat_s_median"] > 0 and latency["generate_s_median"] > 0
    assert latency["overhead"] == pytest.approx(latency["chat_s_median"] / latency["generate_s_median"] - 1)
    # the re-tokenisation cost: one conversation of three turns, both paths timed on each turn
    (conversation,) = out["retokenisation"]["conversations"]
    assert conversation["turns"] == 3 and conversation["session_s_per_turn"] > 0
    assert conversation["baseline_s_per_turn"] > 0 and out["retokenisation"]["gpu_generation"]["s_per_turn"] > 0


@pytest.mark.timeout(300)
def test_view_times_every_page_of_a_generated_run_in_chromium():
    """CI installs Chromium (.ci/run); elsewhere, without it, this skips saying so."""
    import os

    if not os.path.exists("/usr/bin/chromium") and not os.environ.get("CI"):
        pytest.skip("needs /usr/bin/chromium (apt-get install chromium)")
    out = report("view.py", "--samples", "128", "--repeat", "1", timeout=280)  # about 20 s on 2 idle cores
    assert out["benchmark"] == "view" and out["inputs"] == {"samples": 128, "repeat": 1, "rollouts_mb": out["inputs"]["rollouts_mb"],
                                                              "generated": True}
    assert set(out["pages"]) == {"run", "step", "sample", "search_text", "search_filter", "compare"}
    for page in out["pages"].values():
        assert 0 < page["ready_ms_median"] <= page["ready_ms_max"]
    assert out["server_peak_rss_mb"] >= out["server_rss_mb"] > 0 and out["baseline"]["read_whole_rollouts_ms"] > 0
    assert isinstance(out["meets_target"], bool)
