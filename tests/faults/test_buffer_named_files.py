"""``/start_rollout`` names a file and URLs its task opens (S15): a slime-style task reads ``input_file``
and writes what it read to ``remote_buffer_url``, so a request naming ``/etc/passwd`` and its own URL
would get the file's lines into its buffer. They reach the task only where the operator allowed them.
Real HTTP on loopback; the task generator is registered in process (``rlsdk.testing.ServedBuffer``)."""

from __future__ import annotations

import httpx

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
