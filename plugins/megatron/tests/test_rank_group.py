"""The process group behind multi-GPU megatron training, on gloo with a small object in place of the
trainer: calls reach every rank, a rank's failure is an error on rank 0 naming it and its log, and no
rank outlives the group."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlsdk import RolloutConfig
from rlsdk_megatron.rank_group import RankFailedError, RankGroup

SUMMER = f"{Path(__file__).with_name('rank_targets.py')}:Summer"


def alive(group: RankGroup) -> list[bool]:
    return [process.exit_code() is None and process.process is not None for process in group.ranks]


def test_calls_run_on_every_rank_and_close_ends_them(tmp_path):
    group = RankGroup(SUMMER, RolloutConfig(lr=2.0), 3, tmp_path)
    try:
        assert group.call("total", 1.5) == 9.0  # 1.5 x 2 on each of 3 ranks
        assert group.call("total", 1.0) == 6.0
        processes = [p.process for p in group.ranks]
    finally:
        group.close()
    assert [p.returncode for p in processes] == [0, 0]
    assert (tmp_path / "megatron-rank-2.log").exists()


def test_a_stream_yields_rank_0s_items_and_a_consumer_that_stops_early_leaves_no_rank_waiting(tmp_path):
    """Each item takes every rank (an all-reduce); a consumer that takes one item and stops leaves the
    others run to the end on every rank, so the next call meets them."""
    group = RankGroup(SUMMER, RolloutConfig(lr=1.0), 2, tmp_path)
    try:
        assert list(group.stream("running_totals", 3)) == [0.0, 2.0, 4.0]
        early = group.stream("running_totals", 3)
        assert next(early) == 0.0
        early.close()
        assert group.call("total", 5.0) == 10.0  # not 6.0: rank 1's next item meeting this call
    finally:
        group.close()


@pytest.mark.parametrize("method", ["raise_on", "exit_on"])
def test_a_failing_rank_is_an_error_naming_it_and_its_log(tmp_path, method):
    group = RankGroup(SUMMER, RolloutConfig(lr=1.0), 2, tmp_path)
    try:
        with pytest.raises(
            RankFailedError, match=r"rank 1 exited with status -?\d+ \(log .*megatron-rank-1\.log\)"
        ):
            group.call(method, 1)
        assert alive(group) == [False]
        with pytest.raises(RankFailedError, match="rank 1 exited"):  # the group stays failed
            group.call("total", 1.0)
    finally:
        group.close()


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie: dead, not yet reaped
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_no_rank_outlives_a_killed_rank_0(tmp_path):
    rank_0 = tmp_path / "rank_0.py"
    rank_0.write_text(
        "import time\nfrom pathlib import Path\nfrom rlsdk import RolloutConfig\n"
        "from rlsdk_megatron.rank_group import RankGroup\n"
        f"group = RankGroup({SUMMER!r}, RolloutConfig(lr=1.0), 2, Path({str(tmp_path)!r}))\n"
        "print(group.ranks[0].pid, flush=True)\ntime.sleep(300)\n"
    )
    process = subprocess.Popen([sys.executable, str(rank_0)], stdout=subprocess.PIPE, env=os.environ)
    try:
        rank_1 = int(process.stdout.readline())
    finally:
        process.kill()  # SIGKILL: no atexit hook runs
        process.wait()
    deadline = time.monotonic() + 20
    while not gone(rank_1) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(rank_1)
