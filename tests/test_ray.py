"""``rlsdk run --ray`` on a real local Ray cluster (2 CPUs, dashboard off, 200 MB object store, one per
module): two embedded engines on the tiny Llama (``tiny_llama`` in conftest.py), one SIGKILLed mid-step;
a worker environment lacking a plugin; a grading worker killed mid-task; actors that cannot start; a
trainer that dies."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest
import ray

from rlsdk import CustomGenerate, RolloutConfig, get_plugin_manager, hookimpl
from rlsdk.aio.task_pools import set_cluster_task_pool
from rlsdk.ray.cluster import ActorStartError
from rlsdk.ray.engine_pool import RayEnginePool
from rlsdk.ray.environments import PluginEnvironmentError, differences
from rlsdk.ray.task_pool import RayTaskPool
from rlsdk.ray.trainer_actor import RemoteTrainer, TrainerLostError
from rlsdk.rollout.generate import generate
from rlsdk.rollout.job import run_job
from rlsdk.rollout.ledger import audit_run
from rlsdk.runtime import get_runtime

SLOW_TASK = '''
import os, time
def square_slowly(folder, x):
    """Leave this worker's pid in ``folder``, then take a second and a half."""
    open(os.path.join(folder, str(os.getpid())), "w").close()
    time.sleep(1.5)
    return x * x
'''


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local cluster on 2 CPUs whose workers can import ``slow_task`` (the folder returned)."""
    helpers = tmp_path_factory.mktemp("ray-helpers")
    (helpers / "slow_task.py").write_text(SLOW_TASK)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=200 << 20,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(helpers)}},
    )
    yield helpers
    ray.shutdown()


@pytest.fixture
def run_files(tmp_path: Path) -> tuple[Path, str]:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"w{i} w{i + 1} w{i + 2}"}) + "\n" for i in range(16)))
    reward = tmp_path / "reward.py"
    reward.write_text(
        "def first_token_mod4(args, sample, **kwargs):\n"
        "    return float(sample.response_length > 0 and sample.tokens[sample.prompt_length] % 4 == 0)\n"
    )
    return data, f"{reward}:first_token_mod4"


def ray_args(tiny_llama: Path, run_files: tuple[Path, str], out: Path, **options) -> RolloutConfig:
    data, reward = run_files
    values = {
        "model": str(tiny_llama),
        "prompt_data": str(data),
        "rm_type": reward,
        "rollout_batch_size": 4,
        "n_samples_per_prompt": 8,
        "rollout_max_response_len": 16,
        "num_rollout": 2,
        "engine_threads": 1,
        "train_threads": 1,
        "output_dir": str(out),
        "ray_address": "local",
        "ray_engine_cpus": 0.5,
        "ray_standby_engines": 0,
        "ray_start_timeout": 120.0,
        "sync_check_tol": 1e-3,
        "lr": 3e-2,
    }
    values.update(options)
    return RolloutConfig(**values)


class KillEngines:
    """A custom generate that, on its 40th sample (in step 1, after step 0's 32) and on its 72nd, SIGKILLs
    the engine process with the most requests in flight, then generates as usual: the first kill once the
    pool is at full strength (its spare and standby ready), the second once the first engine is back. At
    its 100th sample it waits for both engines to be back (the tiny steps are quicker than an engine's
    start)."""

    KILL_AT = (40, 72)
    WAIT_AT = 100

    def __init__(self) -> None:
        self.calls = 0
        self.pool = None
        self.killed: list[tuple[int, int]] = []  # (engine, its requests in flight)
        self.alive_later: list[bool] = []

    @hookimpl
    def rlsdk_custom_generates(self):
        yield CustomGenerate(name="kill_engines", func=self.generate)

    async def generate(self, args, sample, sampling_params):
        self.calls += 1
        self.pool = get_runtime(args).engine
        if self.calls in self.KILL_AT:
            ready = (lambda: self.pool.at_full_strength) if not self.killed else self._first_back
            for _ in range(1800):
                if ready():
                    break
                await asyncio.sleep(0.1)
            sent = asyncio.ensure_future(generate(args, sample, sampling_params))
            await asyncio.sleep(0.02)  # this request and the step's others are on their engines
            victim = max(self.pool.replicas_, key=lambda r: r.in_flight)
            self.killed.append((victim.index, victim.in_flight))
            os.kill(victim.info["pid"], signal.SIGKILL)
            return await sent
        if self.calls == self.WAIT_AT:
            for _ in range(900):
                if all(r.alive for r in self.pool.replicas_):
                    break
                await asyncio.sleep(0.1)
            self.alive_later = [r.alive for r in self.pool.replicas_]
        return await generate(args, sample, sampling_params)

    def _first_back(self) -> bool:
        return bool(self.pool.recoveries and self.pool.recoveries[0].rejoined_at)


@pytest.mark.timeout(300)
def test_engines_killed_mid_step_come_back_and_the_run_loses_nothing(
    cluster, tiny_llama, run_files, tmp_path, monkeypatch
):
    """Two engines, a spare and a standby: the first engine killed is replaced by the spare (it takes the
    current weights and passes the trust check), the second by the standby (it loads the model, then the
    same). The used spare is not replaced here (a no-op ``_add_spare``), so that the second kill meets
    the standby whatever the machine's speed; the used standby is."""
    monkeypatch.setattr(RayEnginePool, "_add_spare", _no_new_spare)
    killer = KillEngines()
    out = tmp_path / "out"
    args = ray_args(
        tiny_llama,
        run_files,
        out,
        num_engines=2,
        ray_spare_engines=1,
        ray_standby_engines=1,
        ray_engine_cpus=0.25,
        train=True,
        num_rollout=4,
        custom_generate_function_path="kill_engines",
    )
    run_job(args, get_plugin_manager(plugins=[killer]))

    assert len(killer.killed) == 2 and all(in_flight > 0 for _, in_flight in killer.killed)
    first, second = killer.pool.recoveries
    assert [first.engine, second.engine] == [engine for engine, _ in killer.killed]
    assert "died" in first.cause and "died" in second.cause
    assert (first.by, second.by) == ("spare", "standby")
    assert list(first.marks) == ["weights", "trusted"]  # the spare had its model loaded
    assert list(second.marks) == ["started", "weights", "trusted"]  # the standby had its imports done
    for recovery in (first, second):
        times = [recovery.detected_at, *recovery.marks.values(), recovery.rejoined_at]
        assert times == sorted(times)
    assert killer.alive_later == [True, True]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    assert rows[1]["rollout/aborted"] > 0 and rows[1]["ledger/returned"] > 0  # its groups went to the buffer
    for row in rows:  # every step balanced and every sync passed the trust check on every live engine
        assert row["ledger/entered"] == (
            row["ledger/kept"] + row["ledger/dropped"] + row["ledger/returned"] + row["ledger/failed"]
        )
        assert row["ledger/failed"] == 0 and row["train/sync_logprob_max_diff"] < 1e-3
    assert audit_run(out)["lost"] == 0 and audit_run(out)["duplicated"] == 0


async def _no_new_spare(self) -> None:
    return None


def test_a_worker_lacking_a_plugin_stops_the_run_before_the_first_step(
    cluster, tiny_llama, run_files, tmp_path, fake_dist
):
    """The plugin is installed on the driver's path only: Ray's workers do not have it."""
    fake_dist("rlsdk-ghost", "1.0", "ghost", "ghost_plugin", "")
    out = tmp_path / "out"
    with pytest.raises(PluginEnvironmentError) as error:
        run_job(ray_args(tiny_llama, run_files, out), get_plugin_manager())
    message = str(error.value)
    assert f"node {ray.util.get_node_ip_address()}" in message
    assert "rlsdk-ghost 1.0 is installed on the driver but missing on the worker" in message
    assert not (out / "rollouts.jsonl").exists()


def test_on_a_local_cluster_the_engine_s_own_check_stops_the_run_without_a_node_probe(
    cluster, tiny_llama, run_files, tmp_path, fake_dist, monkeypatch
):
    """A cluster of the run's own (``--ray`` local; the module's cluster stands for it here) has one node,
    which the first engine actor's start checks: no separate probe task runs, and a plugin the workers
    lack still stops the run before the first step, naming the engine and its node."""
    import rlsdk.ray.cluster as cluster_module
    import rlsdk.ray.environments as environments

    monkeypatch.setattr(
        cluster_module, "connect", lambda args: cluster_module.Cluster(cluster_module.LOCAL, False)
    )
    monkeypatch.setattr(environments, "check_nodes", _no_probe)
    fake_dist("rlsdk-ghost", "1.0", "ghost", "ghost_plugin", "")
    out = tmp_path / "out"
    with pytest.raises(PluginEnvironmentError) as error:
        run_job(ray_args(tiny_llama, run_files, out), get_plugin_manager())
    message = str(error.value)
    assert message.startswith(f"engine 0 on node {ray.util.get_node_ip_address()} (pid ")
    assert "rlsdk-ghost 1.0 is installed on the driver but missing on the worker" in message
    assert not (out / "rollouts.jsonl").exists()


def _no_probe(*args, **kwargs):
    raise AssertionError("a node probe ran on a local cluster")


class RecordStandby:
    """A custom generate that, on its first sample, waits for the pool's standby to be ready and notes when
    it was created (in its process) and when the engine and the trainer were up."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}
        self.trainer_started_at = 0.0

    @hookimpl
    def rlsdk_custom_generates(self):
        yield CustomGenerate(name="record_standby", func=self.generate)

    async def generate(self, args, sample, sampling_params):
        pool = get_runtime(args).engine
        if not self.seen:
            for _ in range(1800):
                if pool.at_full_strength:
                    break
                await asyncio.sleep(0.1)
            [standby] = pool._standbys
            self.seen = {
                "engine_started": pool.replicas_[0].info["engine"]["started_at"],
                "trainer_started": self.trainer_started_at,
                "standby_created": standby.info["created_at"],
            }
        return await generate(args, sample, sampling_params)


@pytest.mark.timeout(300)
def test_the_standby_is_prepared_once_the_engines_and_the_trainer_are_up(
    cluster, tiny_llama, run_files, tmp_path, monkeypatch
):
    """The standby does not compete with the engines' and the trainer's start for the cores: its actor is
    created once both are up, and it is ready during the first step."""
    recorder = RecordStandby()
    start = RemoteTrainer._start

    async def timed_start(*args):
        place_text = await start(*args)
        recorder.trainer_started_at = time.time()
        return place_text

    monkeypatch.setattr(RemoteTrainer, "_start", staticmethod(timed_start))
    args = ray_args(
        tiny_llama,
        run_files,
        tmp_path / "out",
        train=True,
        num_rollout=1,
        ray_standby_engines=1,
        custom_generate_function_path="record_standby",
    )
    run_job(args, get_plugin_manager(plugins=[recorder]))
    seen = recorder.seen
    assert 0 < seen["engine_started"] < seen["trainer_started"] < seen["standby_created"]


def test_plugin_differences_name_each_distribution_and_both_versions():
    assert differences({"a": "1.0", "b": "2.0", "c": "1"}, {"a": "1.0", "b": "2.1", "d": "3"}) == [
        "b is 2.0 on the driver but 2.1 on the worker",
        "c 1 is installed on the driver but missing on the worker",
        "d 3 is installed on the worker but not on the driver",
    ]


@pytest.mark.timeout(120)
def test_a_grading_worker_killed_mid_task_is_run_again_on_another_worker(cluster):
    pool = RayTaskPool(cpus_per_task=0.5)
    future = pool.submit("slow_task:square_slowly", (str(cluster), 7), timeout=60)
    deadline = time.monotonic() + 60
    while not list(cluster.glob("[0-9]*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    [first] = list(cluster.glob("[0-9]*"))
    os.kill(int(first.name), signal.SIGKILL)
    assert future.result(timeout=60) == 49
    assert {p.name for p in cluster.glob("[0-9]*")} - {first.name}  # scored by another worker


@pytest.mark.timeout(120)
def test_math_grading_goes_to_ray_tasks_while_a_run_is_on_ray(cluster):
    from rlsdk_rm_hub import math_grader
    from rlsdk_rm_hub.pool import get_pool

    pool = RayTaskPool(cpus_per_task=0.5)
    set_cluster_task_pool(pool)
    try:
        assert get_pool() is pool
        assert pool.run(math_grader.GRADE, ("\\frac{1}{2}", "0.5"), 30) is True
    finally:
        set_cluster_task_pool(None)


KILLED_ONCE_REWARD = '''
import os, signal

FOLDER, DRIVER = {folder!r}, {driver}

def response_length(args, sample, **kwargs):
    """The response's length, noting the worker's pid on the sample; the first call SIGKILLs its worker."""
    if os.getpid() == DRIVER:
        raise RuntimeError("scored in the driver, not in a Ray worker")
    marker = os.path.join(FOLDER, "killed")
    if not os.path.exists(marker):
        open(marker, "w").write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    sample.metadata["scored_by"] = os.getpid()
    return float(len(sample.response))
'''


@pytest.mark.timeout(120)
def test_sync_rewards_run_as_ray_tasks_and_a_killed_worker_s_sample_is_scored_again(cluster, tmp_path):
    """With ``ray_sync_rewards`` a plain reward (a path here, the same file on every node) runs in Ray's
    workers, not in the driver; the worker of the first call dies with it and that sample is scored again
    by another worker; what the reward wrote on the samples comes back."""
    from rlsdk.rollout.rewarding import score_group
    from rlsdk.types import Sample

    reward = tmp_path / "reward.py"
    reward.write_text(KILLED_ONCE_REWARD.format(folder=str(tmp_path), driver=os.getpid()))
    args = RolloutConfig(rm_type=f"{reward}:response_length", ray_sync_rewards=True, reward_timeout=60)
    samples = [Sample(prompt="p", response="x" * n) for n in (1, 2, 3)]
    set_cluster_task_pool(RayTaskPool(cpus_per_task=0.5))
    try:
        asyncio.run(score_group(args, get_plugin_manager(), samples))
    finally:
        set_cluster_task_pool(None)
    assert [s.reward for s in samples] == [1.0, 2.0, 3.0]
    killed = int((tmp_path / "killed").read_text())
    scorers = {s.metadata["scored_by"] for s in samples}
    assert killed not in scorers and os.getpid() not in scorers


def test_an_engine_that_cannot_be_placed_names_what_it_asked_for(cluster, tiny_llama, run_files, tmp_path):
    args = ray_args(tiny_llama, run_files, tmp_path / "out", ray_engine_cpus=64.0, ray_start_timeout=2.0)
    with pytest.raises(
        ActorStartError, match=r"engine 0 was not placed on any node within 2s .*'num_cpus': 64"
    ):
        run_job(args)


def test_an_engine_that_fails_to_start_names_node_device_port_and_log(cluster, run_files, tmp_path):
    args = ray_args(tmp_path / "no-model", run_files, tmp_path / "out", engine_device="cpu")
    with pytest.raises(ActorStartError) as error:
        run_job(args, get_plugin_manager())
    message = str(error.value)
    assert message.startswith("engine 0 failed to start after")
    assert (
        f"node {ray.util.get_node_ip_address()}, pid " in message
        and ", device cpu, port none, log " in message
    )
    assert str(tmp_path / "no-model") in message  # the engine's own error
    log_file = message.split(", log ")[1].split(":")[0]
    assert Path(log_file).exists()


@pytest.mark.timeout(180)
def test_a_trainer_that_dies_stops_the_run_naming_the_last_checkpoint(
    cluster, tiny_llama, run_files, tmp_path, monkeypatch
):
    train_step = RemoteTrainer.train_step

    def dying(self, rollout_id, groups):
        if rollout_id == 1:
            ray.kill(self.actor)
        return train_step(self, rollout_id, groups)

    monkeypatch.setattr(RemoteTrainer, "train_step", dying)
    out = tmp_path / "out"
    with pytest.raises(TrainerLostError) as error:
        run_job(
            ray_args(
                tiny_llama,
                run_files,
                out,
                train=True,
                num_rollout=2,
                save_interval=1,
                rollout_max_response_len=2,
            )
        )
    assert (
        f"The last checkpoint is {out / 'checkpoints' / 'step_0'}: continue with rlsdk run --resume "
        f"--output {out}" in str(error.value)
    )


def test_ray_without_an_address_means_a_local_cluster_and_the_runtime_env_is_json():
    from rlsdk_cli.app import fill_optional_values
    from rlsdk_cli.run import build_config

    assert fill_optional_values(["run", "--ray", "--num-engines", "2"]) == [
        "run",
        "--ray",
        "local",
        "--num-engines",
        "2",
    ]
    assert fill_optional_values(["run", "--ray"]) == ["run", "--ray", "local"]
    assert fill_optional_values(["run", "--ray", "auto"]) == ["run", "--ray", "auto"]
    args = build_config(
        None, {"ray_address": "local", "num_engines": 2, "ray_runtime_env": '{"env_vars": {"A": "1"}}'}, []
    )
    assert (args.ray_address, args.num_engines, args.ray_runtime_env) == (
        "local",
        2,
        {"env_vars": {"A": "1"}},
    )
    with pytest.raises(ValueError, match="num_engines 2 needs ray_address"):
        RolloutConfig(num_engines=2)


def test_weights_travel_as_arrays_and_come_back_as_the_same_tensors():
    """bfloat16 (no numpy dtype) as integers of its width; a tied tensor once, as an alias."""
    import pickle

    import torch

    from rlsdk.ray.weights import from_shared, to_shared

    embed = torch.randn(4, 3)
    state = {
        "embed": embed,
        "head": embed,
        "norm": torch.randn(3).to(torch.bfloat16),
        "step": torch.tensor(7),
    }
    shared = pickle.loads(pickle.dumps(to_shared(state)))
    assert shared["head"] == ("embed", "alias") and shared["norm"][1] == "bfloat16"
    back = from_shared(shared)
    assert list(back) == list(state)
    for name, tensor in state.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor)
    assert back["head"].data_ptr() == back["embed"].data_ptr()
