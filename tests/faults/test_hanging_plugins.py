"""Plugins that hang, in real subprocesses: the command finishes, with the sample marked invalid."""

from __future__ import annotations

import json
import subprocess
import sys
import time

RLSDK = [sys.executable, "-c", "from rlsdk_cli.app import main; main()"]


def test_score_with_a_hanging_sync_reward_finishes_and_marks_the_sample(tmp_path):
    """A plain-function reward that never returns used to hold a default-executor thread that
    ``asyncio.run`` waited for at exit: ``rlsdk score`` hung and wrote nothing."""
    (tmp_path / "stuck_rm.py").write_text(
        "import threading\n"
        "def rm(args, sample, **kw):\n"
        "    if sample.label == 'hang':\n"
        "        threading.Event().wait()\n"
        "    return 1.0\n"
    )
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(
        "".join(json.dumps({"response": "r", "label": label}) + "\n" for label in ("ok", "hang", "ok"))
    )
    started = time.monotonic()
    done = subprocess.run(
        [
            *RLSDK,
            "score",
            "--rm",
            f"{tmp_path / 'stuck_rm.py'}:rm",
            "-i",
            str(src),
            "-o",
            str(out),
            "--timeout",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["reward"] for r in rows] == [1.0, None, 1.0]
    assert "timed out after 0.5s" in rows[1]["reward_error"] and "stuck_rm" in rows[1]["reward_error"]


def test_rewards_that_hang_do_not_starve_the_rewards_after_them(rlsdk_pm):
    """More hung sync rewards than the pool has threads: with asyncio's default executor every later
    reward queued behind them and timed out too; now the hung calls are abandoned at their timeout."""
    import threading

    from rlsdk import Reward, RolloutConfig, Sample, hookimpl
    from rlsdk.aio.blocking import DEFAULT_WORKERS
    from rlsdk.testing import score

    release = threading.Event()

    def stuck_or_exact(args, sample, **kwargs):
        if sample.label == "hang":
            release.wait()
        return float(sample.response == sample.label)

    class Plugin:
        @hookimpl
        def rlsdk_rewards(self):
            yield Reward(name="stuck_or_exact", func=stuck_or_exact)

    rlsdk_pm.register(Plugin())
    args = RolloutConfig(rm_type="stuck_or_exact", reward_timeout=0.3)
    hung = [Sample(index=i, response="x", label="hang") for i in range(DEFAULT_WORKERS + 2)]
    later = [Sample(index=i, response="5", label="5") for i in range(8)]
    try:
        score(rlsdk_pm, hung, args)
        score(rlsdk_pm, later, args)
    finally:
        release.set()
    assert all(s.reward is None and "timed out" in s.metadata["reward_error"] for s in hung)
    assert [s.reward for s in later] == [1.0] * 8  # not timed out behind the stuck ones
