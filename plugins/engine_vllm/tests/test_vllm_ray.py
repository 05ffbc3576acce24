"""The vllm engine under Ray: ``--engine vllm --ray-address local --rollout-num-gpus 2
--rollout-num-gpus-per-engine 1`` makes two engine actors, each launching one vLLM server on the GPU Ray gave
it; a server SIGKILLed mid-step is noticed by the health checks, its engine restarted in a new actor (the
weights from disk, checked before it rejoins), its requests in flight come back aborted and the ledger
balances. vLLM needs CUDA: each server is ``fake_vllm_interpreter.py`` serving the stand-in of vLLM's routes in
front of the embedded engine on the tiny Llama, and the cluster declares two GPUs it does not have."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from rlsdk import CustomGenerate, RolloutConfig, get_plugin_manager, get_runtime, hookimpl, single_turn  # noqa: E402
from rlsdk import run_job  # noqa: E402
from rlsdk.testing import ray_test_cluster  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    with ray_test_cluster({"FAKE_VLLM_GENERATE": "1"}):
        yield


def server_pid(log: Path) -> int:
    return int(re.findall(r"\(pid (\d+), CUDA_VISIBLE_DEVICES=", log.read_text())[-1])


class KillServer:
    """On its 24th sample (step 1) SIGKILLs the vLLM server of the engine with the most requests in flight
    (its actor lives on); on its 40th waits for that engine to be back."""

    KILL_AT, WAIT_AT = 24, 40

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.calls = 0
        self.pool = None
        self.killed: tuple[int, int] | None = None
        self.alive_later: list[bool] = []

    @hookimpl
    def rlsdk_custom_generates(self):
        yield CustomGenerate(name="kill_vllm", func=self.generate)

    async def generate(self, args, sample, sampling_params):
        self.calls += 1
        self.pool = get_runtime(args).engine
        if self.calls == self.KILL_AT:
            sent = asyncio.ensure_future(single_turn(args, sample, sampling_params))
            for _ in range(200):
                if any(r.in_flight for r in self.pool.replicas_):
                    break
                await asyncio.sleep(0.01)
            victim = max(self.pool.replicas_, key=lambda r: r.in_flight)
            self.killed = (victim.index, victim.in_flight)
            os.kill(server_pid(self.logs / f"vllm-server-{victim.index}.log"), signal.SIGKILL)
            return await sent
        if self.calls == self.WAIT_AT:
            for _ in range(600):
                if all(r.alive for r in self.pool.replicas_):
                    break
                await asyncio.sleep(0.1)
            self.alive_later = [r.alive for r in self.pool.replicas_]
        return await single_turn(args, sample, sampling_params)


@pytest.mark.timeout(240)
def test_two_vllm_engine_actors_serve_a_run_and_a_killed_server_is_replaced(
    cluster, tiny_llama, fake_python, tmp_path
):
    out = tmp_path / "out"
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"w{i} w{i + 1} w{i + 2}"}) + "\n" for i in range(16)))
    (tmp_path / "reward.py").write_text(
        "def first_token_mod4(args, sample, **kwargs):\n    return float(sample.tokens[-1] % 4 == 0)\n"
    )
    args = RolloutConfig(
        engine="vllm",
        vllm_python=fake_python,
        hf_checkpoint=str(tiny_llama),
        rollout_num_gpus=2,
        rollout_num_gpus_per_engine=1,
        prompt_data=str(data),
        rm_type=f"{tmp_path / 'reward.py'}:first_token_mod4",
        rollout_batch_size=4,
        n_samples_per_prompt=4,
        rollout_max_response_len=8,
        num_rollout=3,
        output_dir=str(out),
        ray_address="local",
        ray_engine_cpus=0.25,
        ray_start_timeout=60.0,
        custom_generate_function_path="kill_vllm",
    )
    killer = KillServer(out / "logs")
    run_job(args, get_plugin_manager(plugins=[killer]))

    pool = killer.pool
    engine, in_flight = killer.killed
    assert in_flight > 0
    [recovery] = pool.recoveries
    assert recovery.engine == engine and recovery.by == "new"
    assert f"vLLM server {engine} (GPUs 0) exited with status -9" in recovery.cause
    assert killer.alive_later == [True, True] and all(r.sent > 0 for r in pool.replicas_)
    gpus = set()
    for index in (0, 1):
        starts = [
            line
            for line in (out / "logs" / f"vllm-server-{index}.log").read_text().splitlines()
            if line.startswith("fake vllm serve starting")
        ]
        assert len(starts) == (2 if index == engine else 1)  # the restarted engine's log has both starts
        assert f"--tensor-parallel-size 1 --seed {42 + index} " in starts[0]
        gpus.add(re.search(r"CUDA_VISIBLE_DEVICES=(\S+)\)", starts[0])[1])
    assert sorted(gpus) == ["0", "1"]  # each on its own GPU
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and rows[1]["rollout/aborted"] > 0
    for row in rows:
        assert row["ledger/entered"] == (
            row["ledger/kept"] + row["ledger/dropped"] + row["ledger/returned"] + row["ledger/failed"]
        )
