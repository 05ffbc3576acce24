"""Attacks on ``rlsdk buffer serve`` over real HTTP on loopback: code loading, cross-site requests."""

from __future__ import annotations

import json

import httpx


def test_task_type_never_loads_code(buffer_service, tmp_path):
    """``task_type`` from the network resolves only to registered task generators: a ``module:callable``
    or a ``.py`` path is refused with 400, and nothing is imported or run."""
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.py"
    evil.write_text(
        f"open({str(marker)!r}, 'w').write('imported')\n"
        f"def run(data):\n    open({str(marker)!r}, 'w').write('called')\n"
    )
    service = buffer_service()
    attempts = ["subprocess:Popen", "subprocess.Popen", "os:system", f"{evil}:run", "evil:run", "evil.run"]
    for task_type in attempts:
        body = {"task_type": task_type, "args": ["touch", str(marker)], "input_file": "x"}
        answer = httpx.post(service.url + "/start_rollout", json=body)
        assert answer.status_code == 400, (task_type, answer.text)
        assert "only registered names" in answer.json()["message"], answer.text
    assert not marker.exists()
    # nor is the task remembered for a restart to run
    assert not (tmp_path / "buffer" / "task.json").exists()


def test_cross_site_requests_are_refused(buffer_service):
    """A web page can make a browser POST a form (text/plain, urlencoded, multipart) or a body-less fetch
    to loopback without asking first; none of those reach the buffer."""
    service = buffer_service()
    item = {
        "instance_id": "a",
        "uid": "a-0",
        "reward": 1.0,
        "messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}],
    }
    raw = json.dumps(item).encode()
    for content_type in (
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ):
        answer = httpx.post(
            service.url + "/buffer/write", content=raw, headers={"Content-Type": content_type}
        )
        assert answer.status_code == 415, (content_type, answer.text)
    page = httpx.post(service.url + "/buffer/write", json=item, headers={"Origin": "http://evil.example"})
    assert page.status_code == 403
    for path in ("/get_rollout_data", "/start_rollout"):  # a fetch from a page with an untyped body
        assert (
            httpx.post(service.url + path, content=raw, headers={"Origin": "http://evil.example"}).status_code
            == 403
        )
    assert httpx.post(service.url + "/get_rollout_data", json={}).json()["data"]["data"] == []
    assert httpx.post(service.url + "/buffer/write", json=item).status_code == 200


def test_odd_json_bodies_get_answers_not_500s(buffer_service):
    service = buffer_service()
    item = {
        "instance_id": "a",
        "reward": 1.0,
        "messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}],
    }
    for path in ("/start_rollout", "/buffer/write", "/get_rollout_data", "/ack_rollout_data"):
        for body in (b"5", b"[1]", b'"x"', b"null", b'{"max_groups": true}', b'{"lease_seconds": -1}'):
            httpx.post(service.url + "/buffer/write", json=item).raise_for_status()  # a group is ready
            answer = httpx.post(
                service.url + path, content=body, headers={"Content-Type": "application/json"}
            )
            assert answer.status_code in (200, 400, 409), (path, body, answer.text)
            assert answer.json()["success"] is False or path == "/get_rollout_data", (path, body)
