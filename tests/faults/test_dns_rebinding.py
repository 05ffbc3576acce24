"""DNS rebinding against every loopback service (S4): a page of ``evil.example`` whose DNS name the
attacker re-points at 127.0.0.1 is same-origin with the service in the browser, so it may send JSON,
read answers and name itself in ``Origin``, but every request it sends carries ``Host: evil.example:PORT``.
Real HTTP on loopback; the engine behind ``rlsdk serve``'s server is :class:`rlsdk.testing.FakeEngine`
(a model is not needed to test the guard)."""

from __future__ import annotations

import httpx
import pytest

from rlsdk import get_plugin_manager
from rlsdk.rollout.buffer_service import BufferService, TrajectoryStore
from rlsdk.testing import ServedBuffer, ServedEngine

from .conftest import RecordingEngine

ITEM = {
    "instance_id": "a",
    "uid": "a-0",
    "reward": 1.0,
    "messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}],
}


def rebinding(url: str, host: str = "evil.example") -> dict[str, str]:
    """The headers of a request from a rebound page: its own name in ``Host`` and ``Origin``."""
    port = url.rsplit(":", 1)[1]
    return {"Host": f"{host}:{port}", "Origin": f"http://{host}:{port}"}


@pytest.fixture
def served_engine(chat_tokenizer):
    with ServedEngine(RecordingEngine(chat_tokenizer)) as served:
        yield served


def test_a_rebound_page_cannot_pause_the_engine_or_touch_sessions(served_engine):
    url, engine = served_engine.url, served_engine.engine
    session = httpx.post(url + "/sessions").json()["id"]
    attacks = [
        ("POST", "/pause_generation"),
        ("POST", "/abort_request"),
        ("POST", "/generate"),
        ("GET", "/model_info"),
        ("DELETE", f"/sessions/{session}"),
        ("GET", f"/sessions/{session}"),
        ("POST", "/v1/chat/completions"),
    ]
    for method, path in attacks:
        answer = httpx.request(method, url + path, json={}, headers=rebinding(url))
        assert answer.status_code == 421, (path, answer.status_code, answer.text)
    assert engine.pauses == 0 and engine.requests == 0
    assert httpx.get(f"{url}/sessions/{session}").status_code == 200  # still open
    # an Origin that is not loopback is refused even when the Host is right (never compared with Host)
    evil_origin = {"Origin": "http://evil.example:" + url.rsplit(":", 1)[1]}
    assert httpx.post(url + "/pause_generation", json={}, headers=evil_origin).status_code == 403
    assert engine.pauses == 0
    # loopback names with any port, and the browser's own loopback pages, are served
    for host in ("localhost:1", "127.0.0.2", "[::1]:80", "LOCALHOST"):
        answer = httpx.post(url + "/pause_generation", json={}, headers={"Host": host})
        assert answer.status_code == 200, (host, answer.text)
    answer = httpx.post(url + "/pause_generation", json={}, headers={"Origin": "http://localhost:3000"})
    assert answer.status_code == 200
    assert engine.pauses == 5


def test_an_allowed_host_is_served_and_others_still_refused(chat_tokenizer):
    with ServedEngine(RecordingEngine(chat_tokenizer), allowed_hosts=["gpu-box.lan"]) as served:
        url = served.url
        assert httpx.post(
            url + "/pause_generation", json={}, headers=rebinding(url, "gpu-box.lan")
        ).is_success
        assert httpx.post(url + "/pause_generation", json={}, headers=rebinding(url)).status_code == 421
        assert served.engine.pauses == 1


def test_a_rebound_page_cannot_write_or_drain_the_buffer(tmp_path):
    service = BufferService(get_plugin_manager(), TrajectoryStore(tmp_path))
    with ServedBuffer(service) as served:
        url = served.url
        assert httpx.post(url + "/buffer/write", json=ITEM).status_code == 200
        for path, body in [
            ("/buffer/write", {**ITEM, "uid": "poison"}),
            ("/get_rollout_data", {}),
            ("/start_rollout", {"task_type": "x"}),
        ]:
            answer = httpx.post(url + path, json=body, headers=rebinding(url))
            assert answer.status_code == 421, (path, answer.text)
        assert service.store.counts() == {
            "written": 1,
            "pending_items": 1,
            "pending_groups": 1,
            "leased_groups": 0,
        }


def test_the_standalone_chat_server_refuses_a_rebound_page(served_engine):
    from rlsdk.agents.server import chat_endpoint, start_chat_server

    engine = served_engine.engine

    async def start():
        chat = await chat_endpoint(engine, engine.tokenizer)
        return await start_chat_server(chat)

    server = served_engine.run(start())
    try:
        session = httpx.post(server.url + "/sessions").json()["id"]
        answer = httpx.delete(f"{server.url}/sessions/{session}", headers=rebinding(server.url))
        assert answer.status_code == 421, answer.text
        assert httpx.get(f"{server.url}/sessions/{session}").status_code == 200
    finally:
        served_engine.run(server.close())
