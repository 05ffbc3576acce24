"""The buffer's memory is bounded (S18): it kept every trajectory in memory with no cap. Now the items no
trainer has taken are held up to a limit; past it a write gets 507, and taking groups frees room."""

from __future__ import annotations

import httpx

from rlsdk import get_plugin_manager
from rlsdk.rollout.buffer_service import BufferService, TrajectoryStore
from rlsdk.testing import ServedBuffer


def item(instance: str, n: int, text: str = "A") -> dict:
    return {
        "instance_id": instance,
        "uid": f"{instance}-{n}",
        "reward": 1.0,
        "messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": text}],
    }


def test_writes_past_the_memory_limit_get_507_until_a_trainer_takes_some(tmp_path):
    store = TrajectoryStore(tmp_path / "buffer", max_held_bytes=4500)
    service = BufferService(get_plugin_manager(load_entrypoints=False), store)
    with ServedBuffer(service) as served:
        statuses = [
            httpx.post(served.url + "/buffer/write", json=item(f"g{i}", 0, "x" * 900)).status_code
            for i in range(6)
        ]
        assert statuses[:4] == [200] * 4 and statuses[4:] == [507, 507]
        full = httpx.post(served.url + "/buffer/write", json=item("g9", 0, "x" * 900))
        assert "no trainer has taken" in full.json()["message"] and store.held_bytes <= 4500
        taken = httpx.post(
            served.url + "/get_rollout_data", json={"max_groups": 2, "lease_seconds": 60}
        ).json()
        assert httpx.post(served.url + "/buffer/write", json=item("g9", 0, "x" * 900)).status_code == 507
        ack = httpx.post(
            served.url + "/ack_rollout_data", json={"lease_id": taken["data"]["meta_info"]["lease_id"]}
        )
        assert ack.status_code == 200
        assert httpx.post(served.url + "/buffer/write", json=item("g9", 0, "x" * 900)).status_code == 200
    reopened = TrajectoryStore(tmp_path / "buffer", max_held_bytes=4500)  # a restart holds what is pending
    assert reopened.held_bytes == store.held_bytes
