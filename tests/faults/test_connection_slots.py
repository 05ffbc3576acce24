"""Connection slots (S3): idle sockets that never sent a request the guard let through cannot lock out
clients with the token, and are closed soon after they connect. Real HTTP and raw sockets on loopback;
the engine is :class:`rlsdk.testing.FakeEngine` (the slots are tested, not a model)."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from aiohttp import web

from rlsdk import get_plugin_manager
from rlsdk.engines.service_guard import ConnectionLimits, guard
from rlsdk.rollout.buffer_service import BufferService, TrajectoryStore
from rlsdk.runtime import BackgroundLoop
from rlsdk.testing import ServedBuffer, ServedEngine

from .conftest import RecordingEngine

AUTH = {"Authorization": "Bearer s3cret-token-of-the-operator"}


def idle_sockets(url: str, count: int) -> list[socket.socket]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return [socket.create_connection((host, int(port)), timeout=10) for _ in range(count)]


def test_idle_strangers_do_not_lock_out_rlsdk_serve_clients(chat_tokenizer):
    options = {"token": AUTH["Authorization"].split()[1], "max_connections": 5}
    with ServedEngine(RecordingEngine(chat_tokenizer), **options) as served:
        strangers = idle_sockets(served.url, 12)
        try:
            for _ in range(3):  # a fresh connection each time
                answer = httpx.post(served.url + "/pause_generation", json={}, headers=AUTH)
                assert answer.status_code == 200, answer.text
        finally:
            for sock in strangers:
                sock.close()
        assert served.engine.pauses == 3


def test_idle_strangers_do_not_lock_out_buffer_clients(tmp_path):
    service = BufferService(get_plugin_manager(load_entrypoints=False), TrajectoryStore(tmp_path))
    options = {"token": AUTH["Authorization"].split()[1], "max_connections": 4, "read_timeout": 60.0}
    with ServedBuffer(service, **options) as served:
        strangers = idle_sockets(served.url, 10)
        try:
            answer = httpx.post(served.url + "/get_rollout_data", json={}, headers=AUTH)
            assert answer.status_code == 200, answer.text
        finally:
            for sock in strangers:
                sock.close()


def status_line(sock: socket.socket) -> bytes:
    """The status line of the whole answer to the request just sent (the app answers ``{}``)."""
    data = b""
    while not data.endswith(b"{}"):
        data += sock.recv(4096)
    return data.split(b"\r\n", 1)[0]


def closed_by_server(sock: socket.socket, within: float = 20.0) -> bool:
    """Whether the server closes ``sock`` (what it still sends is read and dropped)."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


@pytest.fixture
def limited_app():
    """A bare app under the guard and :class:`ConnectionLimits` with a 300 s idle timeout and a 0.5 s
    header timeout."""
    loop = BackgroundLoop("limits")
    limits = ConnectionLimits(
        max_body=1024, read_timeout=5.0, idle_timeout=300.0, max_connections=10, header_timeout=0.5
    )

    async def ok(request):
        return web.json_response({})

    async def start():
        app = web.Application(
            middlewares=[
                guard("tok", lambda m, s: web.json_response({}, status=s)),
                limits.middleware(lambda m, s: web.json_response({}, status=s)),
            ]
        )
        app.add_routes([web.get("/", ok)])
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        return runner, await limits.listen(runner, "127.0.0.1", 0)

    runner, port = loop.run(start(), 30)
    yield f"http://127.0.0.1:{port}"

    async def stop():  # on the server's loop: asyncio's Server.close is not thread-safe
        limits.close()
        await runner.cleanup()

    loop.run(stop(), 30)
    loop.close()


def test_a_stranger_is_closed_at_the_header_timeout_not_the_idle_one(limited_app):
    stranger, refused, trusted = idle_sockets(limited_app, 3)
    refused.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")  # no token: 401, still a stranger
    trusted.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer tok\r\n\r\n")
    assert status_line(trusted) == b"HTTP/1.1 200 OK"
    assert closed_by_server(stranger)
    assert status_line(refused) == b"HTTP/1.1 401 Unauthorized" and closed_by_server(refused)
    time.sleep(0.5)
    trusted.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer tok\r\n\r\n")
    assert status_line(trusted) == b"HTTP/1.1 200 OK"  # kept open: it is idle, not a stranger
    for sock in (stranger, refused, trusted):
        sock.close()


def kept_alive(url: str, count: int, path: str) -> list[socket.socket]:
    """``count`` connections that each had one request answered and stay open, idle (keep-alive)."""
    socks = idle_sockets(url, count)
    for sock in socks:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{{}}".encode())
        assert sock.recv(4096).startswith(b"HTTP/1.1 200"), path
    return socks


@pytest.mark.parametrize("service", ["rlsdk serve", "buffer"])
def test_idle_keep_alive_clients_of_a_server_without_a_token_do_not_hold_every_slot(
    chat_tokenizer, tmp_path, service
):
    """Without a token every client is let in: clients that made one request and stayed idle held every
    slot for 300 s and new clients got 503 (issue 47: 8). Now an idle connection gives its slot up (the
    oldest first); one in a request never does."""
    if service == "buffer":
        store = BufferService(get_plugin_manager(load_entrypoints=False), TrajectoryStore(tmp_path))
        served_cm, path = ServedBuffer(store, max_connections=4, read_timeout=300.0), "/get_rollout_data"
    else:
        served_cm, path = (
            ServedEngine(RecordingEngine(chat_tokenizer), max_connections=4),
            "/pause_generation",
        )
    with served_cm as served:
        busy = idle_sockets(served.url, 1)[0]  # in a request: its body is still coming
        busy.sendall(f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{{".encode())
        idle = kept_alive(served.url, 3, path)
        try:
            for _ in range(3):  # a fresh connection each time
                answer = httpx.post(served.url + path, json={})
                assert answer.status_code == 200, answer.text
            assert closed_by_server(idle[0], within=5)  # the oldest idle one gave its slot up
            busy.sendall(b"}")
            assert b" 200 " in busy.recv(4096).split(b"\r\n", 1)[0]  # never taken from a request
        finally:
            for sock in (busy, *idle):
                sock.close()
