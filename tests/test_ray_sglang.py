"""``rlsdk run --ray --engine sglang``: SGLang servers launched in engine actors on GPUs, one per actor.

SGLang needs CUDA, so each actor's server is a real subprocess of ``fake_sglang_interpreter.py`` (passed
as ``sglang_python``: real HTTP, a worker in its process group, SGLang's response shapes). Ray sees no GPUs
here: the local cluster (one for this module, 2 CPUs, dashboard off) declares 2, and Ray sets each GPU
actor's ``CUDA_VISIBLE_DEVICES`` to its own, as on a GPU node. Everything else is real: the actors, their
placement groups, the run, the ledger."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
import ray

from rlsdk import CustomGenerate, RolloutConfig, get_plugin_manager, hookimpl
from rlsdk.errors import RlsdkError
from rlsdk.ray.engine_actor import EngineActor
from rlsdk.rollout.generate import generate
from rlsdk.rollout.job import run_job
from rlsdk.rollout.ledger import audit_run
from rlsdk.runtime import get_runtime

FAKE = Path(__file__).with_name("fake_sglang_interpreter.py")


@pytest.fixture(scope="module")
def gpu_cluster() -> None:
    ray.init(
        num_cpus=2, num_gpus=2, include_dashboard=False, object_store_memory=200 << 20, log_to_driver=False
    )
    yield
    ray.shutdown()


@pytest.fixture
def fake_python(tmp_path: Path) -> str:
    """An 'interpreter' whose ``-m sglang.launch_server`` is the fake server (environment set here: Ray's
    workers do not see the test's)."""
    script = tmp_path / "fake-python"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    script.chmod(0o755)
    return str(script)


def sglang_args(tiny_llama: Path, fake_python: str, out: Path, **options) -> RolloutConfig:
    data = out.parent / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"w{i} w{i + 1} w{i + 2}"}) + "\n" for i in range(16)))
    reward = out.parent / "reward.py"
    reward.write_text(
        "def first_token_mod4(args, sample, **kwargs):\n    return float(sample.tokens[-1] % 4 == 0)\n"
    )
    values = {
        "engine": "sglang",
        "hf_checkpoint": str(tiny_llama),
        "sglang_python": fake_python,
        "rollout_num_gpus": 2,
        "rollout_num_gpus_per_engine": 1,
        "prompt_data": str(data),
        "rm_type": f"{reward}:first_token_mod4",
        "rollout_batch_size": 4,
        "n_samples_per_prompt": 4,
        "rollout_max_response_len": 8,
        "num_rollout": 3,
        "output_dir": str(out),
        "ray_address": "local",
        "ray_engine_cpus": 0.25,
        "ray_start_timeout": 60.0,
    }
    values.update(options)
    return RolloutConfig(**values)


def server_pid(log: Path) -> int:
    """The fake server's pid, from its start-up line in its log (the last start's)."""
    return int(re.findall(r"\(pid (\d+), CUDA_VISIBLE_DEVICES=", log.read_text())[-1])


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


class KillServer:
    """A custom generate that on its 24th sample (step 1) SIGKILLs the SGLang server of the engine with
    the most requests in flight (its actor lives on), and on its 40th waits for that engine to be back."""

    KILL_AT, WAIT_AT = 24, 40

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.calls = 0
        self.pool = None
        self.killed: tuple[int, int, int] | None = None  # (engine, its requests in flight, server pid)
        self.alive_later: list[bool] = []

    @hookimpl
    def rlsdk_custom_generates(self):
        yield CustomGenerate(name="kill_server", func=self.generate)

    async def generate(self, args, sample, sampling_params):
        self.calls += 1
        self.pool = get_runtime(args).engine
        if self.calls == self.KILL_AT:
            sent = asyncio.ensure_future(generate(args, sample, sampling_params))
            await asyncio.sleep(0.02)  # this request and the step's others are on their engines
            victim = max(self.pool.replicas_, key=lambda r: r.in_flight)
            pid = server_pid(self.logs / f"sglang-server-{victim.index}.log")
            self.killed = (victim.index, victim.in_flight, pid)
            os.kill(pid, signal.SIGKILL)
            return await sent
        if self.calls == self.WAIT_AT:
            for _ in range(600):
                if all(r.alive for r in self.pool.replicas_):
                    break
                await asyncio.sleep(0.1)
            self.alive_later = [r.alive for r in self.pool.replicas_]
        return await generate(args, sample, sampling_params)


@pytest.mark.timeout(120)
def test_two_sglang_engine_actors_each_serve_one_server_and_a_killed_server_is_replaced(
    gpu_cluster, tiny_llama, fake_python, tmp_path
):
    """Two engines from ``--rollout-num-gpus 2 --rollout-num-gpus-per-engine 1``: each actor launches
    one server on its own GPU (base GPU id 0 of its ``CUDA_VISIBLE_DEVICES``), port and seed, and both
    serve the run. One server SIGKILLed mid-step in its live actor is noticed by the health checks; that
    engine is restarted in a new actor and placement group (no standby by default on GPUs), its requests
    in flight come back aborted, their groups go back to the buffer, and the ledger balances."""
    out = tmp_path / "out"
    killer = KillServer(out / "logs")
    args = sglang_args(tiny_llama, fake_python, out, custom_generate_function_path="kill_server")
    run_job(args, get_plugin_manager(plugins=[killer]))

    pool = killer.pool
    engine, in_flight, pid = killer.killed
    assert in_flight > 0 and wait_gone(pid, 1)
    [recovery] = pool.recoveries
    assert recovery.engine == engine and recovery.by == "new"
    assert (
        f"SGLang server {engine} (GPUs 0, port " in recovery.cause
        and "exited with status -9" in recovery.cause
    )
    assert recovery.rejoined_at - recovery.detected_at < 30 and killer.alive_later == [True, True]
    assert len({r.info["engine"]["url"] for r in pool.replicas_}) == 2
    assert all(r.sent > 0 for r in pool.replicas_)  # both engines served the run

    starts = {}
    for index in (0, 1):
        log = (out / "logs" / f"sglang-server-{index}.log").read_text()
        lines = [line for line in log.splitlines() if line.startswith("fake sglang.launch_server starting")]
        assert len(lines) == (2 if index == engine else 1)  # the restarted engine's log has both starts
        for line in lines:
            assert "--tp-size 1 --base-gpu-id 0 " in line and f"--random-seed {42 + index}" in line
        starts[index] = lines[0]
    ports = {index: re.search(r"--port (\d+)", line)[1] for index, line in starts.items()}
    gpus = {index: re.search(r"CUDA_VISIBLE_DEVICES=(\S+)\)", line)[1] for index, line in starts.items()}
    assert ports[0] != ports[1] and sorted(gpus.values()) == ["0", "1"]

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and rows[1]["rollout/aborted"] > 0 and rows[1]["ledger/returned"] > 0
    for row in rows:
        assert row["ledger/entered"] == (
            row["ledger/kept"] + row["ledger/dropped"] + row["ledger/returned"] + row["ledger/failed"]
        )
    audit = audit_run(out)
    assert audit["lost"] == 0 and audit["duplicated"] == 0
    deadline = time.monotonic() + 10  # every placement group removed (Ray frees them in the background)
    while ray.available_resources().get("GPU") != 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("GPU") == 2, ray.util.placement_group_table()


def test_more_sglang_engine_actors_than_gpus_is_an_error_before_any_starts(
    gpu_cluster, tiny_llama, fake_python, tmp_path
):
    out = tmp_path / "out"
    with pytest.raises(
        RlsdkError,
        match=r"^4 GPUs needed for the SGLang engines \(4 engines, 0 spare, 0 standby; "
        r"1 GPUs each\), but the Ray cluster has 2",
    ):
        run_job(sglang_args(tiny_llama, fake_python, out, rollout_num_gpus=4))
    with pytest.raises(RlsdkError, match=r"^3 GPUs needed .*\(2 engines, 0 spare, 1 standby"):
        run_job(sglang_args(tiny_llama, fake_python, out, ray_standby_engines=1))
    with pytest.raises(
        ValueError,
        match=r"--num-engines 3 disagrees with --rollout-num-gpus 2 / "
        r"--rollout-num-gpus-per-engine 1 = 2 SGLang engines",
    ):
        run_job(sglang_args(tiny_llama, fake_python, out, num_engines=3))
    assert not list((out / "logs").glob("sglang-server-*.log"))


@pytest.mark.timeout(60)
def test_an_engine_actor_killed_with_sigkill_takes_its_sglang_server_with_it(
    gpu_cluster, tiny_llama, fake_python, tmp_path
):
    """The server is started from the actor's event-loop thread; PR_SET_PDEATHSIG fires when the actor's
    process dies, so no server is left holding the GPU. Weights from disk reach the server (logged by the
    fake)."""
    args = sglang_args(tiny_llama, fake_python, tmp_path / "out")
    actor = ray.remote(EngineActor).options(num_cpus=0.25, num_gpus=1, max_concurrency=10).remote(args, 1)
    where = ray.get(actor.where.remote())
    info = ray.get(actor.start.remote(1), timeout=30)
    assert info["url"].startswith(f"http://{where['node']}:") and info["in_process_weights"] is False
    ray.get(actor.update_weights_from_disk.remote(str(tmp_path / "step_1"), "1"), timeout=30)
    log = tmp_path / "out" / "logs" / "sglang-server-1.log"
    assert f'/update_weights_from_disk {{"model_path": "{tmp_path / "step_1"}", "weight_version": "1"}}' in (
        log.read_text()
    )
    assert ray.get(actor.health.remote()) is None
    pid = server_pid(log)
    os.kill(where["pid"], signal.SIGKILL)
    assert wait_gone(pid), "the SGLang server outlived its actor"
