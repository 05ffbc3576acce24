"""``rlsdk run --ray`` on a real local Ray cluster (2 CPUs and 2 declared GPUs, dashboard off, 200 MB
object store, one per module): two embedded engines on the tiny Llama (``tiny_llama`` in conftest.py),
one SIGKILLed mid-step; a worker environment lacking a plugin; a grading worker killed mid-task; actors
that cannot start; a trainer that dies; SGLang engine actors on the declared GPUs (fake servers, see
their section)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import time
from pathlib import Path

import pytest
from rlsdk import CustomGenerate, RolloutConfig, get_plugin_manager, hookimpl
from rlsdk.aio.task_pools import set_cluster_task_pool
from rlsdk.errors import RlsdkError
from rlsdk.ray.cluster import ActorStartError
from rlsdk.ray.engine_actor import EngineActor
from rlsdk.ray import engine_pool
from rlsdk.ray.engine_pool import HEALTH_CALL_MARGIN, RayEnginePool
from rlsdk.ray.environments import PluginEnvironmentError, differences
from rlsdk.ray.task_pool import RayTaskPool
from rlsdk.ray.trainer_actor import RemoteTrainer, TrainerLostError, launch_trainer, trainer_resources
from rlsdk.rollout.generate import generate
from rlsdk.testing import ray_test_cluster
from rlsdk.run.job import run_job
from rlsdk.rollout.ledger import audit_run
from rlsdk.runtime import get_runtime
from rlsdk.training.sync import CUDA_CHECK_TOL, TrustProbe, check_tolerance, trust_check
from rlsdk.types import Sample

ray = pytest.importorskip("ray", reason="rlsdk[ray] is not installed")

SLOW_TASK = '''
import os, time
def square_slowly(folder, x):
    """Leave this worker's pid in ``folder``, then take four seconds (time for the test to kill it, loaded)."""
    open(os.path.join(folder, str(os.getpid())), "w").close()
    time.sleep(4)
    return x * x
'''


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local cluster on 2 CPUs and 2 declared GPUs whose workers can import ``slow_task`` (the folder
    returned)."""
    helpers = tmp_path_factory.mktemp("ray-helpers")
    (helpers / "slow_task.py").write_text(SLOW_TASK)
    with ray_test_cluster({"PYTHONPATH": str(helpers), "FAKE_SGLANG_GENERATE": "1"}):
        yield helpers


@pytest.fixture(autouse=True)
def every_gpu_free_first(request: pytest.FixtureRequest) -> None:
    """A test on the module's cluster starts with its 2 GPUs free: Ray frees the last test's actors and
    placement groups in the background, and on a loaded machine that outlasted a next test's 60 s start
    (four tests failed in a row once)."""
    if "cluster" not in request.fixturenames or not ray.is_initialized():
        return
    deadline = time.monotonic() + 120
    while ray.available_resources().get("GPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)


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


async def on_an_engine(pool: RayEnginePool) -> None:
    """Until a request just sent (and the step's others) are on their engines: some engine has requests in
    flight (under load, a request takes more than a few milliseconds to reach its engine). It returns in
    the loop turn that saw them: nothing runs between it and its caller's next line."""
    await until(lambda: any(r.in_flight for r in pool.replicas_), 60, every=0.01)


async def until(ready, seconds: float, every: float = 0.1) -> None:
    """Until ``ready()``, checked every ``every`` seconds for at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while not ready() and time.monotonic() < deadline:
        await asyncio.sleep(every)


@contextlib.asynccontextmanager
async def started_pool(args):
    """The SGLang engines of ``args`` as a started RayEnginePool, closed after."""
    pool = RayEnginePool(args, "sglang", get_plugin_manager().plugin_versions())
    await pool.start()
    try:
        yield pool
    finally:
        await pool.close()


class EngineKiller:
    """A custom generate (named :attr:`NAME`) that counts its samples, holds the run's engine pool, and
    generates as usual: :meth:`kill_busiest` and :meth:`wait_all_alive` are what its subclasses do on
    their chosen samples."""

    NAME = ""

    def __init__(self) -> None:
        self.calls = 0
        self.pool = None
        self.alive_later: list[bool] = []

    @hookimpl
    def rlsdk_custom_generates(self):
        yield CustomGenerate(name=self.NAME, func=self.generate)

    async def generate(self, args, sample, sampling_params):
        self.calls += 1
        self.pool = get_runtime(args).engine
        return await self.on_sample(args, sample, sampling_params)

    async def on_sample(self, args, sample, sampling_params):
        return await generate(args, sample, sampling_params)

    async def kill_busiest(self, args, sample, sampling_params, kill):
        """Generate ``sample``; once it (and the step's others) are on their engines, ``kill(replica)`` the
        engine with the most requests in flight."""
        sent = asyncio.ensure_future(generate(args, sample, sampling_params))
        await on_an_engine(self.pool)
        kill(max(self.pool.replicas_, key=lambda r: r.in_flight))
        return await sent

    async def wait_all_alive(self, seconds: float) -> None:
        await until(lambda: all(r.alive for r in self.pool.replicas_), seconds)
        self.alive_later = [r.alive for r in self.pool.replicas_]


class KillEngines(EngineKiller):
    """A custom generate that, on its 40th sample (in step 1, after step 0's 32) and on its 72nd, SIGKILLs
    the engine process with the most requests in flight, then generates as usual: the first kill once the
    pool is at full strength (its spare and standby ready), the second once the first engine is back. Its
    32nd sample (step 0's last) waits for full strength first, so that step 1 runs with the standby ready
    (it is prepared once the engines and the trainer are up) and its kill meets requests in flight. Step 2's
    samples (from the 65th) wait for the first engine to be back, so that the second kill meets them in
    flight (under load, the others finished while the killer alone waited). At its 100th sample it waits
    for both engines to be back (the tiny steps are quicker than an engine's start)."""

    NAME = "kill_engines"
    READY_AT = 32
    KILL_AT = (40, 72)
    WAIT_AT = 100

    def __init__(self) -> None:
        super().__init__()
        self.killed: list[tuple[int, int]] = []  # (engine, its requests in flight)

    async def on_sample(self, args, sample, sampling_params):
        call = self.calls  # this sample's number (the others count on while it waits)
        if call == self.READY_AT:
            await until(lambda: self.pool.at_full_strength, 180)
        if call > 2 * self.READY_AT and self.killed:
            await until(self._first_back, 180)
        if call in self.KILL_AT:
            if not self.killed:
                await until(lambda: self.pool.at_full_strength, 180)
            return await self.kill_busiest(args, sample, sampling_params, self._kill)
        if call == self.WAIT_AT:
            await self.wait_all_alive(90)
        return await generate(args, sample, sampling_params)

    def _kill(self, victim) -> None:
        self.killed.append((victim.index, victim.in_flight))
        os.kill(victim.info["pid"], signal.SIGKILL)

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
    import rlsdk.run.ray_wiring as wiring

    monkeypatch.setattr(
        wiring, "connect", lambda args, local_cpus: cluster_module.Cluster(cluster_module.LOCAL, False)
    )
    monkeypatch.setattr(wiring, "check_nodes", _no_probe)
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
            await until(lambda: pool.at_full_strength, 180)
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


@pytest.mark.timeout(300)
def test_a_grading_worker_killed_mid_task_is_run_again_on_another_worker(cluster):
    """The waits are long: on a loaded 2-core machine a Ray worker took over a minute to start."""
    pool = RayTaskPool(cpus_per_task=0.5)
    future = pool.submit("slow_task:square_slowly", (str(cluster), 7), timeout=200)
    deadline = time.monotonic() + 120
    while not list(cluster.glob("[0-9]*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    [first] = list(cluster.glob("[0-9]*"))
    os.kill(int(first.name), signal.SIGKILL)
    assert future.result(timeout=150) == 49
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
    from rlsdk.plugins.run_plugins import RunPlugins
    from rlsdk.ray.task_pool import score_on_cluster
    from rlsdk.rollout.rewarding import score_group
    from rlsdk.types import Sample

    reward = tmp_path / "reward.py"
    reward.write_text(KILLED_ONCE_REWARD.format(folder=str(tmp_path), driver=os.getpid()))
    args = RolloutConfig(rm_type=f"{reward}:response_length", ray_sync_rewards=True, reward_timeout=60)
    samples = [Sample(prompt="p", response="x" * n) for n in (1, 2, 3)]
    set_cluster_task_pool(RayTaskPool(cpus_per_task=0.5))
    try:
        plugins = RunPlugins(args, get_plugin_manager())
        plugins.reward_runner = score_on_cluster  # what the Ray wiring of a run with ray_sync_rewards sets
        asyncio.run(score_group(args, plugins, samples))
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


@pytest.mark.timeout(120)
def test_the_trainer_builds_from_a_named_model_folder_without_waiting_for_the_engines(
    cluster, tiny_llama, run_files, tmp_path
):
    """With the model folder on the command line, the trainer actor builds its trainer right after its
    imports, while the engines start (no engine runs here); a model the engine resolves itself (a name,
    not a folder) waits for the engines to name the folder. The driver's side then has the trainer's
    device and dtype, which set the trust check's tolerance: without them a CUDA trainer on an H200
    was checked at the CPU tolerance and its run stopped at the first sync."""
    args = ray_args(
        tiny_llama, run_files, tmp_path / "a", train=True, train_dtype="bfloat16", sync_check_tol=None
    )
    named = launch_trainer(args)
    later = launch_trainer(ray_args(tiny_llama, run_files, tmp_path / "b", train=True, model="smollm2"))
    try:
        assert later.started is None
        assert ray.get(named.started, timeout=100) == {"device": "cpu", "dtype": "torch.bfloat16"}
        trainer = RemoteTrainer(args, "torch", get_plugin_manager().plugin_versions(), named)
        assert (trainer.device, trainer.dtype) == ("cpu", "torch.bfloat16")
        assert check_tolerance(args, trainer) == CUDA_CHECK_TOL
    finally:
        named.kill()
        later.kill()


def test_the_trainer_actor_asks_for_a_gpu_per_trainer_process_on_a_cluster_with_gpus(cluster):
    """``train_device`` ``auto`` on a cluster with GPUs (this one declares 2) means the trainer's
    processes (``actor_num_gpus_per_node``, default TP x PP) each get one; ``cpu`` none."""
    assert trainer_resources(RolloutConfig()) == {"num_cpus": 1, "num_gpus": 1}
    assert trainer_resources(RolloutConfig(tensor_model_parallel_size=2))["num_gpus"] == 2
    assert trainer_resources(RolloutConfig(actor_num_gpus_per_node=2))["num_gpus"] == 2
    assert trainer_resources(RolloutConfig(train_device="cpu"))["num_gpus"] == 0


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


# ---------------------------------------------------------------- SGLang engines on GPUs
# SGLang needs CUDA, so each engine actor's server below is a real subprocess of
# ``fake_sglang_interpreter.py`` (``sglang_python``: real HTTP, SGLang's response shapes). Ray sees no GPUs
# here: the module's cluster declares 2, and Ray sets each GPU actor's ``CUDA_VISIBLE_DEVICES`` to its own.


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


@contextlib.contextmanager
def stopped(pid: int):
    """Process ``pid`` stopped (SIGSTOP) for the block, then continued if it still runs."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def server_pid(log: Path) -> int:
    """The fake server's pid, from its start-up line in its log (the last start's)."""
    return int(re.findall(r"\(pid (\d+), CUDA_VISIBLE_DEVICES=", log.read_text())[-1])


def closed(url: str, timeout: float = 10.0) -> bool:
    """Whether the server at ``url`` is gone (its port refuses connections) within ``timeout`` seconds."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
        except OSError:
            return True
        time.sleep(0.05)
    return False


class KillServer(EngineKiller):
    """A custom generate that on its 24th sample (step 1) SIGKILLs the SGLang server of the engine with
    the most requests in flight (its actor lives on), and on its 40th waits for that engine to be back."""

    NAME = "kill_server"
    KILL_AT, WAIT_AT = 24, 40

    def __init__(self, logs: Path) -> None:
        super().__init__()
        self.logs = logs
        self.killed: tuple[int, int, str] | None = None  # (engine, its requests in flight, server URL)

    async def on_sample(self, args, sample, sampling_params):
        if self.calls == self.KILL_AT:
            return await self.kill_busiest(args, sample, sampling_params, self._kill)
        if self.calls == self.WAIT_AT:
            await self.wait_all_alive(60)
        return await generate(args, sample, sampling_params)

    def _kill(self, victim) -> None:
        pid = server_pid(self.logs / f"sglang-server-{victim.index}.log")
        self.killed = (victim.index, victim.in_flight, victim.info["engine"]["url"])
        os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(120)
def test_two_sglang_engine_actors_each_serve_one_server_and_a_killed_server_is_replaced(
    cluster, tiny_llama, fake_python, tmp_path
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
    engine, in_flight, url = killer.killed
    assert in_flight > 0 and closed(url, 1)
    [recovery] = pool.recoveries
    assert recovery.engine == engine and recovery.by == "new"
    exited = f"SGLang server {engine} (GPUs 0, port " in recovery.cause and "exited with status -9" in recovery.cause
    refused = f"{url}/health failed" in recovery.cause  # a check under way when it died saw this first
    assert exited or refused, recovery.cause
    assert recovery.detected_at < recovery.rejoined_at and killer.alive_later == [True, True]
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


class KillServerInEval(KillServer):
    """KillServer's kill, on the eval's 6th sample instead (no wait after it)."""

    KILL_AT, WAIT_AT = 6, 0

    async def generate(self, args, sample, sampling_params, evaluation=False):
        if not evaluation:
            return await generate(args, sample, sampling_params)
        return await super().generate(args, sample, sampling_params)


@pytest.mark.timeout(120)
def test_eval_groups_an_engine_death_aborted_run_again_once_it_is_back(
    cluster, tiny_llama, fake_python, tmp_path
):
    """On 2x H200 an SGLang server killed during the eval before the first step left 764 of its 768
    samples aborted, and the eval reported a held-out reward of 0.0. An aborted eval group now runs again
    from its prompt: the eval here, with one server SIGKILLed mid-way, scores every sample."""
    out = tmp_path / "out"
    killer = KillServerInEval(out / "logs")
    args = sglang_args(
        tiny_llama,
        fake_python,
        out,
        custom_generate_function_path="kill_server",
        num_rollout=1,
        eval_interval=1,
        eval_prompt_data=["held_out", str(tmp_path / "prompts.jsonl")],
    )
    run_job(args, get_plugin_manager(plugins=[killer]))

    assert killer.killed is not None and killer.killed[1] > 0
    assert len(killer.pool.recoveries) == 1
    [row] = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert row["eval/held_out/invalid"] == 0 and row["eval/held_out/aborted"] == 0
    assert row["eval/held_out/prompts"] == 16 and killer.calls > 16  # the aborted groups ran again


def test_more_sglang_engine_actors_than_gpus_is_an_error_before_any_starts(
    cluster, tiny_llama, fake_python, tmp_path
):
    out = tmp_path / "out"
    with pytest.raises(
        RlsdkError,
        match=r"^4 GPUs needed for the sglang engines \(4 engines, 0 spare, 0 standby; "
        r"1 GPUs each\), but the Ray cluster has 2",
    ):
        run_job(sglang_args(tiny_llama, fake_python, out, rollout_num_gpus=4))
    with pytest.raises(RlsdkError, match=r"^3 GPUs needed .*\(2 engines, 0 spare, 1 standby"):
        run_job(sglang_args(tiny_llama, fake_python, out, ray_standby_engines=1))
    with pytest.raises(
        RlsdkError, match=r"^3 GPUs needed .* and the trainer \(1\), .*train on CPU \(--train-device cpu\)"
    ):
        run_job(sglang_args(tiny_llama, fake_python, out, train=True))
    with pytest.raises(
        ValueError,
        match=r"--num-engines 3 disagrees with --rollout-num-gpus 2 / "
        r"--rollout-num-gpus-per-engine 1 = 2 sglang engines",
    ):
        run_job(sglang_args(tiny_llama, fake_python, out, num_engines=3))
    assert not list((out / "logs").glob("sglang-server-*.log"))


@pytest.mark.timeout(90)
def test_the_version_handshake_leaves_out_an_engine_whose_actor_died(
    cluster, tiny_llama, fake_python, tmp_path
):
    """An engine actor killed just before the weight-version handshake asks it what it serves: its pool
    is told and brings it back, and the handshake leaves it out, as it does an engine lost any other way
    (its Ray error once stopped a training run)."""
    import ray

    from rlsdk.training.trust import stale_replicas

    args = sglang_args(tiny_llama, fake_python, tmp_path / "out")

    async def scenario() -> tuple[list, list]:
        async with started_pool(args) as pool:
            ray.kill(pool.replicas()[0].actor)
            return await stale_replicas(pool, 0), list(pool.recoveries)

    stale, recoveries = asyncio.run(scenario())
    assert stale == []
    assert [r.engine for r in recoveries] == [0] and recoveries[0].cause.startswith("its actor died")


@pytest.mark.timeout(90)
def test_a_hanging_health_check_holds_up_no_other_engines_check(cluster, tiny_llama, fake_python, tmp_path):
    """Each engine's health check runs on its own. With engine 0's server stopped (SIGSTOP: its ``/health``
    answers nothing until ``rollout_health_check_timeout``), engine 1's server SIGKILLed while idle is
    still found well before engine 0's check times out; when the checks of all engines were awaited together,
    that death waited out engine 0's timeout (60 s here, so the two are far apart even on a loaded machine)."""
    out = tmp_path / "out"
    timeout = 60.0
    args = sglang_args(tiny_llama, fake_python, out, rollout_health_check_timeout=timeout)

    async def scenario() -> float:
        async with started_pool(args) as pool:
            hanging, killed = (server_pid(out / "logs" / f"sglang-server-{i}.log") for i in (0, 1))
            with stopped(hanging):
                await asyncio.sleep(2)  # engine 0's check is under way, and hangs
                os.kill(killed, signal.SIGKILL)
                started = time.monotonic()
                while not pool.recoveries and time.monotonic() - started < timeout + 10:
                    await asyncio.sleep(0.05)
                [recovery] = pool.recoveries
                assert recovery.engine == 1 and recovery.cause.startswith("its engine is down: ")
                return time.monotonic() - started

    assert asyncio.run(scenario()) < timeout / 4  # not held up by engine 0's hanging check


def test_each_engine_actor_call_waits_as_long_as_its_option_says():
    """A generation waits ``--generate-timeout``, none meaning as long as it takes (not the 120 s of the other
    calls, which would replace an engine busy with a long answer); a weight load ``--weight-sync-timeout``."""
    unbounded = RolloutConfig(generate_timeout=None)
    assert engine_pool.call_deadline(unbounded, "generate") == (None, "--generate-timeout")
    assert engine_pool.call_deadline(RolloutConfig(), "generate") == (600.0, "--generate-timeout")
    assert engine_pool.call_deadline(unbounded, "flush_cache") == (120.0, "--ray-call-timeout")
    assert engine_pool.call_deadline(unbounded, "update_weights_from_disk")[1] == "--weight-sync-timeout"


@pytest.mark.timeout(90)
def test_an_engine_actor_that_does_not_answer_a_call_within_its_deadline_is_replaced(
    cluster, tiny_llama, fake_python, tmp_path, monkeypatch
):
    """An engine actor's calls other than generations, weight loads and its start have ``ray_call_timeout``:
    with engine 0's server stopped (SIGSTOP), a cache flush (SGLang's client would wait an hour) gets engine
    1's answer, and engine 0 is taken for hung, named with the call and the option, and replaced. The health
    checks are slowed down so that the flush is the first to find it."""
    monkeypatch.setattr(engine_pool, "HEALTH_INTERVAL", 60.0)
    args = sglang_args(tiny_llama, fake_python, tmp_path / "out", ray_call_timeout=2.0)

    async def scenario() -> None:
        async with started_pool(args) as pool:
            with stopped(server_pid(tmp_path / "out" / "logs" / "sglang-server-0.log")):
                assert await pool.flush_cache()  # engine 1's answer; engine 0 left to its restart
                [recovery] = pool.recoveries
                assert recovery.engine == 0
                assert recovery.cause == "flush_cache not done within 2s (--ray-call-timeout)"

    asyncio.run(scenario())


@pytest.mark.timeout(90)
def test_no_engine_is_taken_for_dead_for_a_health_check_that_overlapped_a_weight_push(
    cluster, tiny_llama, fake_python, tmp_path
):
    """A real SGLang server holds every request, ``/health``'s too, while it loads weights, which takes
    minutes for a large model: as slime pauses its health monitor then, a check that overlapped a push
    says nothing. Engine 0's server is stopped (SIGSTOP) for 4 s during a push, well past the 1 s health
    timeout, and is not replaced; stopped as long with no push under way, it is."""
    args = sglang_args(tiny_llama, fake_python, tmp_path / "out", rollout_health_check_timeout=1.0)

    async def scenario() -> None:
        async with started_pool(args) as pool:
            server = server_pid(tmp_path / "out" / "logs" / "sglang-server-0.log")
            with stopped(server):
                pushed = asyncio.ensure_future(pool.update_weights_from_disk(str(tiny_llama), "1"))
                await asyncio.sleep(4)
            await asyncio.wait_for(pushed, 10)
            await asyncio.sleep(HEALTH_CALL_MARGIN + 3)  # the checks under way during the push are over
            assert pool.recoveries == []

            with stopped(server):
                await until(lambda: pool.recoveries, 20, every=0.05)
                [recovery] = pool.recoveries
                assert recovery.engine == 0 and "/health failed: TimeoutError" in recovery.cause

    asyncio.run(scenario())


@pytest.mark.timeout(90)
def test_an_engine_found_dead_by_a_weight_push_is_brought_back_with_those_weights(
    cluster, tiny_llama, fake_python, tmp_path, monkeypatch
):
    """On 2x H200 an SGLang server SIGKILLed just before a weight sync made the push fail with "cannot
    reach SGLang", which stopped the run. The health checks are slowed down here so that the push is the
    first to find engine 0's server dead: the push goes on without it, and engine 0 comes back with the
    pushed weights."""
    monkeypatch.setattr(engine_pool, "HEALTH_INTERVAL", 60.0)
    args = sglang_args(tiny_llama, fake_python, tmp_path / "out")

    async def scenario() -> None:
        async with started_pool(args) as pool:
            os.kill(server_pid(tmp_path / "out" / "logs" / "sglang-server-0.log"), signal.SIGKILL)
            await pool.update_weights_from_disk(str(tiny_llama), "1")
            [recovery] = pool.recoveries
            assert recovery.engine == 0 and "exited with status -9" in recovery.cause
            pool.remember_trust_probe(TrustProbe(Sample(), [], 0.05))
            await until(lambda: all(r.alive for r in pool.replicas_), 40, every=0.05)
            assert "weights" in recovery.marks and [r.alive for r in pool.replicas_] == [True, True]

    asyncio.run(scenario())
    log = (tmp_path / "out" / "logs" / "sglang-server-0.log").read_text()
    assert log.count("/update_weights_from_disk") == 1  # the replacement's: the first server was dead


class FakeServerLogProbs:
    """The trainer's part of the trust check, as the fake server scores: log-prob -1 per response token."""

    def response_log_probs(self, samples: list[Sample]) -> list[list[float]]:
        return [[-1.0] * sample.response_length for sample in samples]


@pytest.mark.timeout(90)
def test_an_engine_that_dies_during_the_trust_check_is_left_out_and_checked_again_before_it_rejoins(
    cluster, tiny_llama, fake_python, tmp_path
):
    """On 2x H200 an SGLang engine stopped answering during the trust check after a weight sync; the health
    checks replaced it, and the check's request to it raised Ray's ActorDiedError, which stopped the run.
    Here engine 0's server hangs (SIGSTOP) on the check's request and is then SIGKILLed: the check goes
    on with engine 1, and engine 0's replacement takes the synced weights and passes the same probe
    before it rejoins."""
    args = sglang_args(tiny_llama, fake_python, tmp_path / "out")
    probe = Sample(group_index=0, index=0, tokens=[5, 6, 7, 8, 9, 10], response_length=3)

    async def scenario() -> None:
        async with started_pool(args) as pool:
            await pool.update_weights_from_disk(str(tiny_llama), "1")
            hung = server_pid(tmp_path / "out" / "logs" / "sglang-server-0.log")
            os.kill(hung, signal.SIGSTOP)
            checked = asyncio.ensure_future(trust_check(pool, FakeServerLogProbs(), probe, 0.05))
            await asyncio.sleep(1)
            assert not checked.done()  # waiting on engine 0
            os.kill(hung, signal.SIGKILL)
            assert await asyncio.wait_for(checked, 20) == 0.0  # engine 1's
            await until(lambda: all(r.alive for r in pool.replicas_), 40, every=0.05)
            [recovery] = pool.recoveries
            assert recovery.engine == 0 and {"weights", "trusted"} <= recovery.marks.keys()
            assert [r.alive for r in pool.replicas_] == [True, True]

    asyncio.run(scenario())
    log = (tmp_path / "out" / "logs" / "sglang-server-0.log").read_text()
    assert log.count("/update_weights_from_disk") == 2  # the first server's sync, and the replacement's


@pytest.mark.timeout(60)
def test_an_engine_late_to_its_health_check_is_busy_while_it_answers_requests_and_hung_once_it_does_not(
    cluster, tiny_llama, fake_python, tmp_path
):
    """A real SGLang server with a thousand requests in flight answered ``/health`` 10 s late on an H200,
    and the pool replaced a working engine. Here the server answers ``/health`` 3 s late, past
    ``rollout_health_check_timeout``: while generations come back meanwhile the engine is healthy; once
    none do, the same late answer is a hung engine."""
    args = sglang_args(tiny_llama, fake_python, tmp_path / "out", rollout_health_check_timeout=1.0)
    env = {"FAKE_SGLANG_HEALTH_DELAY": "3", "FAKE_SGLANG_GENERATE_DELAY": "0.1"}
    actor = (
        ray.remote(EngineActor)
        .options(num_cpus=0.25, num_gpus=1, max_concurrency=10, runtime_env={"env_vars": env})
        .remote(args, 1)
    )
    try:  # the actor holds the cluster's one GPU: killed however the test ends, or the next test waits for it
        ray.get(actor.start.remote(1), timeout=30)
        payload = {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 2}}

        checked = actor.health.remote()
        answers = 0
        while not ray.wait([checked], timeout=0)[0]:
            reply = ray.get(actor.generate.remote(payload), timeout=10)
            assert reply["meta_info"]["finish_reason"]["type"] == "length"
            answers += 1
        # generations came back while the check waited (how many depends on the machine's load): busy
        assert answers >= 1 and ray.get(checked) is None

        started = time.monotonic()
        problem = ray.get(actor.health.remote(), timeout=10)
        # the check gave up at its 1 s timeout (the late answer, 3 s after, would have said healthy)
        assert problem is not None and "/health failed: TimeoutError" in problem, problem
        assert time.monotonic() - started > 0.9
    finally:
        ray.kill(actor)


@pytest.mark.timeout(60)
def test_an_engine_actor_killed_with_sigkill_takes_its_sglang_server_with_it(
    cluster, tiny_llama, fake_python, tmp_path
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
    os.kill(where["pid"], signal.SIGKILL)
    assert closed(info["url"]), "the SGLang server outlived its actor"


@pytest.mark.timeout(90)
def test_an_engine_that_does_not_take_its_weights_within_the_sync_timeout_is_replaced(
    cluster, tiny_llama, fake_python, tmp_path, monkeypatch
):
    """Engine 0's server is stopped (SIGSTOP) while the weights are pushed: it never completes its update.
    Past ``--weight-sync-timeout`` the pool takes it for dead, the push returns with the other engine
    updated, and engine 0 comes back with the pushed weights; without the timeout the push waits forever."""
    monkeypatch.setattr(engine_pool, "HEALTH_INTERVAL", 60.0)
    args = sglang_args(tiny_llama, fake_python, tmp_path / "out", weight_sync_timeout=2.0)

    async def scenario() -> None:
        async with started_pool(args) as pool:
            with stopped(server_pid(tmp_path / "out" / "logs" / "sglang-server-0.log")):
                await asyncio.wait_for(pool.update_weights_from_disk(str(tiny_llama), "1"), 30)
                [recovery] = pool.recoveries
                assert recovery.engine == 0
                assert "update_weights_from_disk not done within 2s (--weight-sync-timeout)" in recovery.cause
                pool.remember_trust_probe(TrustProbe(Sample(), [], 0.05))
                await until(lambda: all(r.alive for r in pool.replicas_), 40, every=0.05)
                assert "weights" in recovery.marks and [r.alive for r in pool.replicas_] == [True, True]

    asyncio.run(scenario())


@pytest.mark.timeout(300)
def test_async_on_ray_trains_one_step_off_policy_with_the_engine_and_the_trainer_as_actors(
    cluster, tiny_llama, run_files, tmp_path
):
    """``--async`` with the embedded engine and the trainer as Ray actors: each step after the first trains
    on samples the previous policy generated while the trainer trained, every sync passes the trust check."""
    out = tmp_path / "out"
    run_job(ray_args(tiny_llama, run_files, out, train=True, train_async=True, num_rollout=3))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["async/lag_max"] for r in rows] == [0, 1, 1]
    assert all(r["train/sync_logprob_max_diff"] < 1e-3 for r in rows[1:])
    versions = {}
    for line in (out / "rollouts.jsonl").read_text().splitlines():
        row = json.loads(line)
        versions.setdefault(row["rollout_id"], set()).update(row["weight_versions"])
    assert versions == {0: {"default"}, 1: {"default"}, 2: {"1"}}
    assert audit_run(out)["lost"] == 0 and audit_run(out)["duplicated"] == 0
