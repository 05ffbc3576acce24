"""The servers a run starts for itself (T24): another local process cannot drive them without the run's
secret; the run's own code can (its clients send the secret; slime-style code posting with its own HTTP
client is recognised as this process by its socket). The engine is :class:`rlsdk.testing.FakeEngine` behind the run's real loopback server (the
guard and the clients are what is tested, not a model)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import pytest

from rlsdk import Engine, RolloutConfig, get_plugin_manager, hookimpl
from rlsdk.engines.run_tokens import token_for
from rlsdk.engines.sglang_client import SGLangClient
from rlsdk.run.session import close_runtime, open_runtime, resolve_run_plugins
from rlsdk.slime_compat import http_utils

from .conftest import RecordingEngine

pytestmark = pytest.mark.plugins("rlsdk_rm_hub")


def with_engine(engine):
    """The installed plugins and an engine plugin ``recording`` that gives ``engine``."""

    class Plugin:
        @hookimpl
        def rlsdk_engines(self):
            yield Engine(name="recording", func=lambda args: engine)

    return get_plugin_manager(plugins=[Plugin()])


@pytest.fixture
def run_runtime(chat_tokenizer, monkeypatch):
    monkeypatch.delenv("RLSDK_SERVE_TOKEN", raising=False)
    engine = RecordingEngine(chat_tokenizer)
    pm = with_engine(engine)
    args = RolloutConfig.from_dict({"engine": "recording"})
    runtime = open_runtime(args, resolve_run_plugins(args, pm))
    yield runtime, args, engine
    close_runtime(runtime)


def test_another_process_cannot_pause_the_runs_engine_server(run_runtime):
    runtime, args, engine = run_runtime
    url = f"http://{runtime.args.sglang_router_ip}:{runtime.args.sglang_router_port}"  # the run's view
    health_checks = engine.requests
    paths = ["/pause_generation", "/abort_request", "/generate", "/sessions"]
    another_process = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import httpx\nfor path in {paths!r}:\n    print(httpx.post({url!r} + path, json={{}}).status_code)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert another_process.stdout.split() == ["401"] * 4, another_process.stdout + another_process.stderr
    assert engine.pauses == 0 and engine.requests == health_checks
    # this process's own code, even a slime-style function posting with its own client and no token
    assert httpx.post(url + "/pause_generation", json={}).status_code == 200
    assert engine.pauses == 1
    # the run's own clients: slime's http_utils (its generators) and the SGLang client
    body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}
    reply = runtime.run(http_utils.post(url + "/generate", body, max_retries=1))
    assert reply["meta_info"]["completion_tokens"] >= 1

    async def through_client():
        client = SGLangClient(url)
        await client.start()
        try:
            await client.pause()
        finally:
            await client.close()

    runtime.run(through_client())
    assert engine.pauses == 2


def test_each_run_gets_its_own_secret_and_forgets_it_at_the_end(chat_tokenizer, monkeypatch):
    monkeypatch.delenv("RLSDK_SERVE_TOKEN", raising=False)
    engine = RecordingEngine(chat_tokenizer)
    pm = with_engine(engine)
    tokens = []
    for _ in range(2):
        args = RolloutConfig.from_dict({"engine": "recording"})
        runtime = open_runtime(args, resolve_run_plugins(args, pm))
        url = f"http://{runtime.args.sglang_router_ip}:{runtime.args.sglang_router_port}"  # the run's view
        tokens.append(token_for(url))
        close_runtime(runtime)
        assert token_for(url) is None
        engine.url = None
        asyncio.set_event_loop(None)
    assert all(t and len(t) >= 32 for t in tokens) and tokens[0] != tokens[1]
