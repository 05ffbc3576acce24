"""Bearer tokens (S2): a one-character token was accepted, and wrong guesses were answered at about 1,400
a second. Now a token has at least 16 characters, and wrong-token requests are slowed down for the whole
service, however many connections they come on."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from rlsdk import get_plugin_manager
from rlsdk.engines.service_guard import FAILED_AUTH_PER_SECOND, FailedAuthLimiter
from rlsdk.rollout.buffer_service import BufferService, TrajectoryStore, start_buffer_server
from rlsdk.run.engine_server import start_server
from rlsdk.testing import FakeEngine, ServedBuffer

RLSDK = [sys.executable, "-c", "from rlsdk_cli.app import main; main()"]


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["buffer", "serve", "--port", "0"]])
def test_a_short_token_is_refused_at_start(command, tmp_path):
    done = subprocess.run(
        [*RLSDK, *command, "--token", "x"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "has 1 characters, fewer than 16" in done.stderr


def test_short_tokens_are_refused_by_the_server_functions_too(tmp_path):
    import asyncio

    with pytest.raises(ValueError, match="fewer than 16"):
        asyncio.run(start_server(FakeEngine([]), token="short"))
    service = BufferService(get_plugin_manager(load_entrypoints=False), TrajectoryStore(tmp_path))
    with pytest.raises(ValueError, match="fewer than 16"):
        asyncio.run(start_buffer_server(service, "127.0.0.1", 0, token="short"))


def test_wrong_guesses_are_slowed_to_a_rate_for_the_whole_service():
    now = [0.0]
    limiter = FailedAuthLimiter(clock=lambda: now[0])
    delays = [limiter.delay() for _ in range(100)]  # 100 guesses at one instant, on any connections
    assert delays[:10] == [0.0] * 10  # a burst of mistakes is answered at once
    assert delays[-1] == pytest.approx(90 / FAILED_AUTH_PER_SECOND)  # the rest wait their turn
    now[0] = 1000.0
    assert limiter.delay() == 0.0  # and the bucket empties again


def test_a_wrong_token_is_still_a_401(tmp_path):
    service = BufferService(get_plugin_manager(load_entrypoints=False), TrajectoryStore(tmp_path))
    with ServedBuffer(service, token="a-long-enough-operator-token") as served:
        answer = httpx.post(served.url + "/get_rollout_data", json={}, headers={"Authorization": "Bearer no"})
        assert answer.status_code == 401
