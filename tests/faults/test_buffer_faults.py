"""Faults on ``rlsdk buffer serve`` (a real subprocess on loopback, SIGKILL, raw sockets): nothing
acknowledged is ever lost, and bad or slow clients cannot take it down."""

from __future__ import annotations

import json
import socket
import subprocess
import time

import httpx
import pytest

from .conftest import BUFFER_CLI, buffer_item, buffer_run_inputs


def take(url, **body):
    return httpx.post(url + "/get_rollout_data", json=body).json()["data"]


def uids(data):
    return sorted(i["uid"] for i in data["data"])


def raw_request(url, head: bytes, timeout=5.0) -> bytes:
    """Send ``head`` as it is on a new connection; the start of the answer."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head)
        return sock.recv(65536)


def test_unacknowledged_groups_are_served_again(buffer_service):
    """Groups were logged as served before the answer reached the trainer: a dropped connection lost
    them. Now they are leased; a lease that is not acknowledged ends and the groups are served again."""
    service = buffer_service()
    for n in range(2):
        httpx.post(service.url + "/buffer/write", json=buffer_item("a", n)).raise_for_status()
    first = take(service.url, lease_seconds=3)  # long enough for a loaded machine to ask again within it
    assert uids(first) == ["a-0", "a-1"]
    assert take(service.url, lease_seconds=3)["data"] == []  # leased: not served twice at once
    time.sleep(3.2)
    again = take(service.url, lease_seconds=30)
    assert uids(again) == ["a-0", "a-1"]
    late = httpx.post(service.url + "/ack_rollout_data", json={"lease_id": first["meta_info"]["lease_id"]})
    assert late.status_code == 409 and "served again" in late.json()["message"]
    ok = httpx.post(service.url + "/ack_rollout_data", json={"lease_id": again["meta_info"]["lease_id"]})
    assert ok.json()["acknowledged"] == 2 and take(service.url)["data"] == []


def test_sigkill_between_lease_and_ack_loses_nothing(buffer_service, tmp_path):
    service = buffer_service()
    for group in ("a", "b"):
        for n in range(2):
            httpx.post(service.url + "/buffer/write", json=buffer_item(group, n)).raise_for_status()
    acked = take(service.url, lease_seconds=30, max_groups=1)
    assert (
        httpx.post(
            service.url + "/ack_rollout_data", json={"lease_id": acked["meta_info"]["lease_id"]}
        ).status_code
        == 200
    )
    leased = take(service.url, lease_seconds=30)
    assert len(uids(acked)) == len(uids(leased)) == 2
    service.kill()  # the trainer received the second group, the service died before its acknowledgement
    service = buffer_service(data_dir=tmp_path / "buffer")
    assert uids(take(service.url)) == uids(leased)


def test_a_line_cut_by_a_crash_does_not_swallow_the_next_item(buffer_service, tmp_path):
    """The cut line was never acknowledged; the next item used to be appended onto it, unreadable at the
    following restart: an acknowledged item lost."""
    service = buffer_service()
    httpx.post(service.url + "/buffer/write", json=buffer_item("a", 0)).raise_for_status()
    service.kill()
    items = tmp_path / "buffer" / "items.jsonl"
    with open(items, "ab") as file:  # what a crash in the middle of a write leaves
        file.write(json.dumps(buffer_item("a", 1)).encode()[:40])
    service = buffer_service(data_dir=tmp_path / "buffer")
    assert httpx.post(service.url + "/buffer/write", json=buffer_item("a", 2)).status_code == 200
    service.kill()
    service = buffer_service(data_dir=tmp_path / "buffer")
    assert uids(take(service.url)) == ["a-0", "a-2"]


def test_a_uid_like_a_generated_one_drops_nothing(buffer_service):
    """Uid-less items used to get ``<instance>#<count>``: an agent's own uid ``a#1`` made them duplicates."""
    service = buffer_service()
    httpx.post(service.url + "/buffer/write", json={**buffer_item("a"), "uid": "a#1"}).raise_for_status()
    for _ in range(3):
        answer = httpx.post(service.url + "/buffer/write", json=buffer_item("a")).json()
        assert answer["message"] == "Data has been successfully written to buffer"
    assert len(take(service.url)["data"]) == 4


def test_non_finite_rewards_are_refused(buffer_service):
    service = buffer_service()
    for reward in ("NaN", "Infinity", "-Infinity", '{"acc": NaN}'):
        body = json.dumps(buffer_item("a", 0)).replace('"reward": 1.0', f'"reward": {reward}')
        answer = httpx.post(
            service.url + "/buffer/write", content=body, headers={"Content-Type": "application/json"}
        )
        assert answer.status_code == 400 and "not standard JSON" in answer.json()["message"], reward
    overflow = json.dumps(buffer_item("a", 0)).replace('"reward": 1.0', '"reward": 1e999')  # parses as inf
    answer = httpx.post(
        service.url + "/buffer/write", content=overflow, headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 400 and "finite" in answer.json()["message"]
    assert take(service.url)["data"] == []


def test_lengths_that_lie_are_refused(buffer_service):
    service = buffer_service("--max-body-mb", "0.01")
    body = json.dumps(buffer_item("a", 0)).encode()
    host = service.url.removeprefix("http://")
    for length in (b"-1", b"-100", b"abc"):
        answer = raw_request(
            service.url,
            b"POST /buffer/write HTTP/1.1\r\nHost: "
            + host.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + length
            + b"\r\n\r\n"
            + body,
        )
        assert answer.split(b" ")[1] == b"400", answer[:200]
    huge = raw_request(
        service.url,
        b"POST /buffer/write HTTP/1.1\r\nHost: "
        + host.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n"
        + body,
    )
    assert huge.split(b" ")[1] == b"413", huge[:200]
    assert take(service.url)["data"] == []


def test_slow_and_half_open_clients_are_cut_off(buffer_service):
    """500 half-open connections used to hold 501 threads; now a connection that sends no whole request
    within the read timeout is closed, and past the connection limit a new one takes the slot of the
    oldest of them (S3: idle strangers lock nobody out)."""
    service = buffer_service("--read-timeout", "1", "--max-connections", "20")
    host, port = service.url.removeprefix("http://").split(":")
    slow = []
    for _ in range(30):
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"POST /buffer/write HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        slow.append(sock)
    time.sleep(0.3)
    assert httpx.post(service.url + "/buffer/write", json=buffer_item("a", 0)).status_code == 200
    started = time.monotonic()
    while time.monotonic() - started < 10:
        try:
            if httpx.post(service.url + "/buffer/write", json=buffer_item("a", 0)).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    assert time.monotonic() - started < 5, "slow connections were not closed"
    for sock in slow:
        sock.settimeout(2)
        try:
            answer = sock.recv(200)  # closed by the service: refused (503) past the limit, or cut off
        except ConnectionResetError:  # cut off with a reset (unread request bytes were pending): closed too
            answer = b""
        assert answer == b"" or answer.startswith(b"HTTP/1.1 503"), answer
        sock.close()
    body_late = socket.create_connection((host, int(port)))  # headers, then a body that never comes
    body_late.sendall(
        b"POST /buffer/write HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n{"
    )
    body_late.settimeout(5)
    assert body_late.recv(200).startswith(b"HTTP/1.1 408")
    body_late.close()


@pytest.mark.plugins("rlsdk_generators", "rlsdk_embedded")
def test_groups_a_run_took_come_back_when_it_dies_before_saving_them(
    buffer_service, misbehaving_engine, small_tokenizer, tmp_path
):
    """The ``rollout_buffer`` rollout acknowledged groups as they came: a run that died before the state
    holding them was saved (in a training run, before its next checkpoint) lost them for good. Now they stay
    leased until a saved state covers their step, and the run started again releases the rest. Here the
    run takes group ``a``, then dies waiting for ``b``; ``rlsdk buffer serve`` is a real subprocess, the run
    is ``run_job`` in process (its engine, only health-checked, the misbehaving server in good mood)."""
    from rlsdk import RolloutConfig
    from rlsdk.errors import RlsdkError
    from rlsdk.run.job import run_job

    service = buffer_service()
    tokenizer, chats = buffer_run_inputs(service, small_tokenizer, tmp_path, "Q")
    out = tmp_path / "run"
    args = {
        "engine": misbehaving_engine.url,
        "hf_checkpoint": str(tokenizer),
        "prompt_data": str(chats),
        "rollout_function_path": "rollout_buffer",
        "rollout_buffer_url": service.url,
        "num_rollout": 1,
        "rollout_batch_size": 2,
        "n_samples_per_prompt": 2,
        "rollout_buffer_wait": 1.0,
        "output_dir": str(out),
    }
    with pytest.raises(RlsdkError, match="1 of 2 complete groups"):
        run_job(RolloutConfig(**args))
    assert take(service.url)["data"] == []  # a is still leased to the dead run

    for n in range(2):
        httpx.post(service.url + "/buffer/write", json=buffer_item("b", n)).raise_for_status()
    run_job(RolloutConfig(**args, resume=True))
    rows = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(r["metadata"]["uid"] for r in rows) == ["a-0", "a-1", "b-0", "b-1"]
    assert json.loads((out / "rollout_buffer_leases.json").read_text()) == []  # acknowledged once saved
    service.kill()
    restarted = buffer_service(data_dir=tmp_path / "buffer")  # from its folder: nothing left to serve
    assert take(restarted.url)["data"] == []


def test_a_second_buffer_service_on_a_store_in_use_fails_naming_the_folder_and_the_holder(
    buffer_service, tmp_path
):
    """Two ``rlsdk buffer serve`` on one ``--data-dir`` used to append to the same files and serve the same
    groups twice (issue 47: locks on every folder written)."""
    first = buffer_service(data_dir=tmp_path / "store")
    second = subprocess.run(
        [*BUFFER_CLI, "--data-dir", str(tmp_path / "store")], capture_output=True, text=True, timeout=60
    )
    assert second.returncode == 1, second.stdout + second.stderr
    assert (
        f"{tmp_path / 'store'} is in use by another rlsdk buffer serve (pid {first.proc.pid}) as its --data-dir"
        in second.stderr
    )
    first.kill()
    restarted = buffer_service(data_dir=tmp_path / "store")  # the lock went with the killed process
    assert httpx.post(restarted.url + "/get_rollout_data", json={}).status_code == 200
