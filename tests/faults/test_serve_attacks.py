"""Attacks on ``rlsdk serve`` over real HTTP on loopback, against the real small model (CPU, float32):
authentication, weight loading from arbitrary folders, parameter overflows, oversized prompts, clients
that go away."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx
import pytest

from rlsdk.run.engine_server import start_server
from rlsdk.testing import ServedEngine

RLSDK = [sys.executable, "-c", "from rlsdk_cli.app import main; main()"]
PROMPT = {"input_ids": [1, 2, 3]}


@pytest.fixture(scope="module")
def served():
    EmbeddedEngine = pytest.importorskip("rlsdk_embedded").EmbeddedEngine

    with ServedEngine(EmbeddedEngine(device="cpu", max_batch_size=8)) as served:
        yield served


@pytest.fixture
def server(served):
    """``server(**options)``: another server on the module's engine, closed at the end."""
    handles = []

    def start(**options):
        handles.append(served.run(start_server(served.engine, "127.0.0.1", 0, **options)))
        return handles[-1].url

    yield start
    for handle in handles:
        served.run(handle.close())
    served.engine.url = served.url


def test_off_loopback_needs_a_token_before_loading_anything(tmp_path):
    env_without = {k: v for k, v in __import__("os").environ.items() if k != "RLSDK_SERVE_TOKEN"}
    refused = subprocess.run(
        [*RLSDK, "serve", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env_without,
    )
    assert refused.returncode == 2 and "needs a bearer token" in refused.stderr


def test_token_is_required_on_every_endpoint(server):
    url = server(token="s3cret-of-sixteen+")
    for method, path in [
        ("GET", "/model_info"),
        ("POST", "/pause_generation"),
        ("POST", "/abort_request"),
        ("POST", "/update_weights_from_disk"),
        ("POST", "/generate"),
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/sessions"),
    ]:
        assert httpx.request(method, url + path, json={}).status_code == 401, path
        wrong = httpx.request(method, url + path, json={}, headers={"Authorization": "Bearer s3cret-of-sixteen"})
        assert wrong.status_code == 401, path
    ok = httpx.post(
        url + "/generate",
        json={**PROMPT, "sampling_params": {"max_new_tokens": 1}},
        headers={"Authorization": "Bearer s3cret-of-sixteen+"},
        timeout=60,
    )
    assert ok.status_code == 200 and ok.json()["meta_info"]["completion_tokens"] == 1


def test_the_engine_client_sends_the_token(server, monkeypatch):
    import asyncio

    from rlsdk.engines.sglang_client import SGLangClient

    url = server(token="s3cret-of-sixteen+")
    monkeypatch.setenv("RLSDK_SERVE_TOKEN", "s3cret-of-sixteen+")

    async def generate():
        client = SGLangClient(url)
        try:
            return await client.generate({**PROMPT, "sampling_params": {"max_new_tokens": 1}})
        finally:
            await client.close()

    assert asyncio.run(generate())["meta_info"]["completion_tokens"] == 1


def test_slow_clients_do_not_hold_up_the_others(served):
    """Half-open connections cost the aiohttp server a coroutine each, not a thread."""
    import socket

    host, port = served.url.removeprefix("http://").split(":")
    slow = [socket.create_connection((host, int(port))) for _ in range(200)]
    for sock in slow:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\n")  # and never the rest
    started = time.perf_counter()
    ok = httpx.post(
        served.url + "/generate", json={**PROMPT, "sampling_params": {"max_new_tokens": 1}}, timeout=30
    )
    assert ok.status_code == 200 and time.perf_counter() - started < 5
    for sock in slow:
        sock.close()


def test_connections_past_the_limit_are_refused(server):
    import socket

    url = server(max_connections=3)
    host, port = url.removeprefix("http://").split(":")
    held = [socket.create_connection((host, int(port))) for _ in range(3)]
    for sock in held:  # clients in a request hold their slots (idle ones would give theirs up)
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10\r\n\r\n{")
    time.sleep(0.2)
    extra = socket.create_connection((host, int(port)))
    extra.settimeout(5)
    assert extra.recv(100).startswith(b"HTTP/1.1 503")
    for sock in [*held, extra]:
        sock.close()
    time.sleep(0.2)
    assert httpx.get(url + "/health", timeout=10).status_code == 200


def test_cross_site_requests_are_refused(served):
    page = {"Origin": "http://evil.example"}
    for path in ("/pause_generation", "/abort_request", "/flush_cache"):
        assert httpx.post(served.url + path, headers=page).status_code == 403, path
    form = httpx.post(
        served.url + "/generate",
        content=b'{"input_ids": [1], "sampling_params": {}}',
        headers={"Content-Type": "text/plain"},
    )
    assert form.status_code == 415
    assert httpx.get(served.url + "/health").status_code == 200


def test_weights_load_only_from_allowed_folders(served, server, tmp_path):
    model = served.engine.model_path
    plain = httpx.post(served.url + "/update_weights_from_disk", json={"model_path": str(model)}, timeout=60)
    assert plain.status_code == 403 and "--allow-weights-dir" in plain.json()["message"]
    url = server(weights_dirs=[tmp_path])
    for path in (str(model), "/etc", f"{tmp_path}/../{model.name}", f"{tmp_path}/{'..' * 1}/x"):
        denied = httpx.post(url + "/update_weights_from_disk", json={"model_path": path}, timeout=60)
        assert denied.status_code == 403 and denied.json()["success"] is False, path
    url = server(weights_dirs=[model.parent])
    ok = httpx.post(
        url + "/update_weights_from_disk",
        json={"model_path": str(model), "weight_version": "v2"},
        timeout=120,
    )
    assert ok.status_code == 200 and ok.json()["success"] is True


@pytest.mark.parametrize(
    "params,message",
    [
        ({"temperature": float("nan")}, "finite"),
        ({"temperature": float("inf")}, "finite"),
        ({"top_p": float("nan")}, "finite"),
        ({"sampling_seed": 2**70}, "sampling_seed"),
        ({"top_k": 0}, "top_k"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"stop": ["never"] * 10_000}, "at most 64 strings"),
        ({"stop": "x" * 100_000}, "at most 64 strings"),
    ],
)
def test_bad_sampling_params_are_a_400_for_that_request_only(served, params, message):
    import json

    body = json.dumps({**PROMPT, "sampling_params": {"max_new_tokens": 1, **params}})  # NaN as JSON allows
    answer = httpx.post(
        served.url + "/generate", content=body, headers={"Content-Type": "application/json"}, timeout=60
    )
    assert answer.status_code == 400 and message in answer.json()["message"], answer.text


def test_a_huge_top_k_fails_no_request(served):
    """A ``top_k`` above the vocabulary used to break the batch's top-k: a 500 for every request in it."""
    results = {}

    def send(name, top_k):
        body = {**PROMPT, "sampling_params": {"max_new_tokens": 8, "top_k": top_k, "ignore_eos": True}}
        results[name] = httpx.post(served.url + "/generate", json=body, timeout=120)

    threads = [threading.Thread(target=send, args=(f"r{i}", 10**12 if i == 0 else 5)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {name: r.status_code for name, r in results.items()} == {f"r{i}": 200 for i in range(4)}
    assert all(r.json()["meta_info"]["completion_tokens"] == 8 for r in results.values())


def test_an_oversized_text_is_refused_before_tokenizing(served):
    """A 20 MB ``text`` used to be tokenized on the event loop first (frozen for a minute, gigabytes)."""
    started = time.perf_counter()
    answer = httpx.post(served.url + "/generate", json={"text": "word " * 4_000_000}, timeout=120)
    assert answer.status_code == 400 and "characters" in answer.json()["message"]
    assert time.perf_counter() - started < 5


def test_a_client_that_goes_away_has_its_generation_aborted(served):
    def running():
        return httpx.get(served.url + "/v1/loads", timeout=30).json()["loads"][0]["num_running_reqs"]

    body = {**PROMPT, "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True, "temperature": 1.0}}
    for stream in (False, True):
        if stream:  # the first chunk arrives, then the client leaves
            with httpx.stream(
                "POST", served.url + "/generate", json={**body, "stream": True}, timeout=30
            ) as response:
                next(response.iter_bytes())
        else:  # the client gives up waiting and closes its connection
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(served.url + "/generate", json=body, timeout=httpx.Timeout(30, read=1.0))
        deadline = time.monotonic() + 10
        while running() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert running() == 0, f"stream={stream}: generation went on after its client left"
