"""``engine: sglang`` launching SGLang: slime's flags to command lines, start-up, timeouts, shutdown.

SGLang needs CUDA, so the servers here are real subprocesses of ``fake_sglang_interpreter.py`` (a slow
start, a worker in the process group, the health and model-info endpoints); the command lines are the
real ones, checked flag by flag."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rlsdk.testing import process_alive, processes_gone

from rlsdk import RolloutConfig
from rlsdk.engines.launch.sglang import (
    SGLangLauncher,
    SGLangLaunchError,
    plan_launch,
    router_flags,
    server_flags,
)
from rlsdk.engines.protocol import EngineUnavailableError
from rlsdk.engines.sglang_client import SGLangClient


def recorded_pids(path: Path) -> list[int]:
    return [int(p) for line in path.read_text().splitlines() for p in line.split()]


def test_one_engine_command_line_follows_slimes_flags():
    args = RolloutConfig(
        sglang_mem_fraction_static=0.6,
        rollout_seed=7,
        extra={
            "sglang_chunked_prefill_size": 4096,
            "sglang_enable_torch_compile": True,
            "sglang_disable_radix_cache": False,
            "sglang_cuda_graph_bs": [1, 2, 4],
        },
    )
    plan = plan_launch(args, "/models/m", python="py", ports=[31000])
    assert plan.router_command is None and plan.url == "http://127.0.0.1:31000"
    (engine,) = plan.engines
    assert engine.command == [
        "py",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/m",
        "--host",
        "127.0.0.1",
        "--port",
        "31000",
        "--tp-size",
        "1",
        "--base-gpu-id",
        "0",
        "--random-seed",
        "7",
        "--mem-fraction-static",
        "0.6",
        "--chunked-prefill-size",
        "4096",
        "--enable-torch-compile",
        "--cuda-graph-bs",
        "1",
        "2",
        "4",
    ]


def test_a_given_router_port_is_where_clients_connect():
    one = plan_launch(RolloutConfig(sglang_router_port=31234), "/m", python="py")
    assert one.url == "http://127.0.0.1:31234" and one.engines[0].port == 31234
    two = plan_launch(RolloutConfig(sglang_router_port=31234, rollout_num_gpus=2), "/m", python="py")
    assert two.url == "http://127.0.0.1:31234" and 31234 not in [e.port for e in two.engines]


def test_several_engines_get_their_own_gpus_and_a_router():
    args = RolloutConfig(
        train=True, rollout_num_gpus=4, rollout_num_gpus_per_engine=2, tensor_model_parallel_size=2
    )
    plan = plan_launch(args, "/m", python="py", ports=[1, 2, 3])
    assert [e.gpus for e in plan.engines] == [[2, 3], [4, 5]]  # after the trainer's two GPUs
    assert [e.command[e.command.index("--tp-size") + 1] for e in plan.engines] == ["2", "2"]
    assert plan.router_command == [
        "py",
        "-m",
        "sglang_router.launch_router",
        "--host",
        "127.0.0.1",
        "--port",
        "3",
        "--worker-urls",
        "http://127.0.0.1:1",
        "http://127.0.0.1:2",
        "--balance-abs-threshold",  # slime's settings, not the router's defaults
        "10",
        "--balance-rel-threshold",
        "1.2",
        "--disable-health-check",
        "--disable-circuit-breaker",
        "--request-timeout-secs",
        "14400",
        "--log-level",
        "warn",
    ]
    assert plan.url == "http://127.0.0.1:3"
    tuned = args.replace(
        extra={
            "router_policy": "power_of_two",
            "router_balance_abs_threshold": 4,
            "router_disable_health_check": False,
        }
    )
    router = plan_launch(tuned, "/m", python="py", ports=[1, 2, 3]).router_command
    assert router is not None and "--disable-health-check" not in router
    assert router[router.index("--balance-abs-threshold") + 1] == "4" and router[-2:] == [
        "--policy",
        "power_of_two",
    ]
    colocated = plan_launch(args.replace(colocate=True), "/m", python="py", ports=[1, 2, 3])
    assert [e.gpus for e in colocated.engines] == [[0, 1], [2, 3]]
    assert all(e.command[-1] == "--enable-memory-saver" for e in colocated.engines)


def test_flags_rlsdk_sets_itself_are_refused_with_the_option_to_use():
    with pytest.raises(ValueError, match="sglang_tp_size: .*--rollout-num-gpus-per-engine"):
        server_flags({"sglang_tp_size": 2})
    assert server_flags({"sglang_url": "http://x", "sglang_server_concurrency": 8}) == []
    with pytest.raises(
        ValueError, match="router_port: rlsdk sets the router's --port itself; use sglang_router_port"
    ):
        router_flags({"router_port": 1})
    with pytest.raises(ValueError, match="multiple of --rollout-num-gpus-per-engine"):
        plan_launch(RolloutConfig(rollout_num_gpus=3, rollout_num_gpus_per_engine=2), "/m", python="py")


def test_launched_servers_and_router_start_and_stop_as_process_groups(fake_python, tmp_path, monkeypatch):
    """Start-up ends once the router lists both servers: it registers them in the background after it
    answers ``/health`` (here 2 s later), and until then a burst of requests would get 503s."""
    monkeypatch.setenv("FAKE_SGLANG_DELAY", "1")
    monkeypatch.setenv("FAKE_ROUTER_REGISTER_DELAY", "2")
    monkeypatch.setenv("FAKE_SGLANG_PIDS", str(tmp_path / "pids"))
    args = RolloutConfig(rollout_num_gpus=2, sglang_python=fake_python)
    launcher = SGLangLauncher(plan_launch(args, "/models/m"), tmp_path / "logs", startup_timeout=60)
    client = SGLangClient(launcher.url, launcher=launcher)

    async def scenario() -> tuple[list[str], dict]:
        await client.start()
        try:
            return await client.workers(), await client.model_info()
        finally:
            await client.close()

    started = time.monotonic()
    workers, info = asyncio.run(scenario())
    assert workers == launcher.plan.worker_urls
    assert (
        info["model_path"] == "" and time.monotonic() - started >= 3
    )  # the router's answer (no --model-path)
    pids = recorded_pids(tmp_path / "pids")
    assert len(pids) == 6  # two servers and the router, each with a worker
    assert processes_gone(pids, timeout=5), "a launched process outlived close()"
    assert "fake sglang.launch_server starting" in (tmp_path / "logs" / "sglang-server-1.log").read_text()
    assert "sglang_router.launch_router" in (tmp_path / "logs" / "sglang-router.log").read_text()


def test_startup_timeout_names_the_log_and_leaves_nothing_running(fake_python, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_SGLANG_DELAY", "60")
    monkeypatch.setenv("FAKE_SGLANG_PIDS", str(tmp_path / "pids"))
    launcher = SGLangLauncher(plan_launch(RolloutConfig(sglang_python=fake_python), "/m"), tmp_path, 2.0)
    with pytest.raises(EngineUnavailableError) as error:
        asyncio.run(launcher.start())
    log = tmp_path / "sglang-server-0.log"
    assert str(error.value).startswith("SGLang server 0 (GPUs 0, port ")
    assert f"did not answer /health_generate within 2s (--sglang-startup-timeout); log: {log}" in str(
        error.value
    )
    assert "fake sglang.launch_server starting" in str(error.value)  # the log's tail
    assert processes_gone(recorded_pids(tmp_path / "pids"), timeout=5)


def test_a_server_that_dies_while_starting_is_reported_with_its_log(fake_python, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_SGLANG_EXIT", "3")
    launcher = SGLangLauncher(plan_launch(RolloutConfig(sglang_python=fake_python), "/m"), tmp_path, 30)
    with pytest.raises(
        SGLangLaunchError,
        match=r"exited with status 3 while starting; log: .*sglang-server-0.log"
        r"\n(.|\n)*CUDA out of memory \(fake\)",
    ):
        asyncio.run(launcher.start())


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_no_orphans_when_rlsdk_is_interrupted_or_killed(fake_python, tmp_path, how):
    """A process that launched SGLang is interrupted (Ctrl-C: the atexit hook stops the groups) or
    killed outright (the kernel's parent-death signal stops the server)."""
    pids_file = tmp_path / "pids"
    program = textwrap.dedent(f"""
        import asyncio, signal, time
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even under a background pytest
        from pathlib import Path
        from rlsdk import RolloutConfig
        from rlsdk.engines.launch.sglang import SGLangLauncher, plan_launch
        launcher = SGLangLauncher(plan_launch(RolloutConfig(sglang_python={fake_python!r}), "/m"), Path({str(tmp_path)!r}))
        asyncio.run(launcher.start())
        print("ready", flush=True)
        time.sleep(600)
    """)
    env = {**os.environ, "FAKE_SGLANG_PIDS": str(pids_file)}
    parent = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "ready"
        server, worker = recorded_pids(pids_file)
        assert process_alive(server) and process_alive(worker)
        parent.send_signal(how)
        parent.wait(timeout=30)
        # The server must go (with Ctrl-C its whole group); the worker of a killed server stops itself, as
        # SGLang's workers watch their parent.
        assert processes_gone([server, worker], timeout=10)
    finally:
        parent.kill()
        for pid in recorded_pids(pids_file) if pids_file.exists() else []:
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.plugins("rlsdk_rm_hub")
def test_rlsdk_run_passes_unknown_sglang_flags_to_the_servers(fake_python, tmp_path, monkeypatch):
    """The CLI end to end: the fake server starts with the passed-through flags, the run then fails (the
    fake generates nothing) and leaves no process behind; a mistyped flag is still an error."""
    from typer.testing import CliRunner

    from rlsdk_cli.app import app
    from rlsdk_cli.run import sglang_passthrough_options

    monkeypatch.setenv("FAKE_SGLANG_PIDS", str(tmp_path / "pids"))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--engine",
            "sglang",
            "--hf-checkpoint",
            str(tmp_path / "no-model"),
            "--output",
            str(out),
            "--sglang-python",
            fake_python,
            "--sglang-chunked-prefill-size",
            "4096",
            "--sglang-cuda-graph-bs",
            "1",
            "2",
            "--sglang-enable-torch-compile",
            "--router-policy",
            "round_robin",
            "--num-rollout",
            "1",
        ],
    )
    assert result.exit_code != 0
    log = (out / "logs" / "sglang-server-0.log").read_text()
    assert "--chunked-prefill-size 4096 --cuda-graph-bs 1 2 --enable-torch-compile" in log
    assert sglang_passthrough_options(
        ["--router-policy", "round_robin", "--router-balance-abs-threshold=4"], []
    ) == [
        'router_policy="round_robin"',
        "router_balance_abs_threshold=4",
    ]
    assert processes_gone(recorded_pids(tmp_path / "pids"), timeout=10)
    typo = CliRunner().invoke(app, ["run", "--rollout-batch-sise", "2"])
    assert typo.exit_code == 2
    assert "did you mean --rollout-batch-size" in " ".join(typo.output.replace("│", " ").split())


@pytest.mark.plugins("rlsdk_rm_hub")
def test_the_gpu_learning_run_launches_colocated_bfloat16_sglang(fake_python, tmp_path, monkeypatch):
    """benchmarks/gpu/learning_gpu.py's ``rlsdk run`` arguments through the CLI (as ``rlsdk_cli.app``'s
    ``main`` reads them), SGLang faked (it needs CUDA): the server starts on the model folder with the
    memory saver (``--colocate``), bfloat16 and the memory fraction; the fake cannot generate, so the run
    stops at the engine's health check, before any data, leaving no process behind."""
    from typer.testing import CliRunner

    from rlsdk_cli.app import app, fill_optional_values, spread_multi_value_flags

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"))
    import learning_gpu

    monkeypatch.setenv("FAKE_SGLANG_PIDS", str(tmp_path / "pids"))
    opts = learning_gpu.options().parse_args(["--trainer", "megatron", "--sglang-python", fake_python])
    out, model = tmp_path / "out", tmp_path / "model"
    command = learning_gpu.run_command(opts, model, out)
    assert command[1:4] == ["-m", "rlsdk_cli.app", "run"]
    result = CliRunner().invoke(app, fill_optional_values(spread_multi_value_flags(command[3:])))
    assert result.exit_code == 1 and "failed its health check" in result.output
    log = (out / "logs" / "sglang-server-0.log").read_text()
    assert f"--model-path {model} " in log
    assert "--mem-fraction-static 0.4 --dtype bfloat16 --enable-memory-saver" in log
    assert processes_gone(recorded_pids(tmp_path / "pids"), timeout=10)


def test_servers_get_nccl_cumem_off_and_no_allocator_settings_unless_set(monkeypatch):
    """The weight broadcast needs NCCL's cuMem allocator off on the server's side too (it failed on two
    H200s with it on); a value the user set is kept; the memory saver refuses expandable segments."""
    from rlsdk.engines.launch.sglang import server_environment

    monkeypatch.delenv("NCCL_CUMEM_ENABLE", raising=False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    env = server_environment()
    assert env["NCCL_CUMEM_ENABLE"] == "0" and "PYTORCH_CUDA_ALLOC_CONF" not in env
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "1")
    assert server_environment()["NCCL_CUMEM_ENABLE"] == "1"


def test_a_killed_servers_zombie_worker_does_not_hold_up_its_stop(fake_python, tmp_path):
    """A SIGKILLed server's worker dies with it but is adopted by a process that does not reap it at once
    (Ray's raylet is such a subreaper; here the launching process itself): the group then holds only a
    zombie, which must count as stopped, or each health check that found the death waits out the stop's
    20 s grace before it reports (a Ray engine's death took 20 s to notice)."""
    pids_file = tmp_path / "pids"
    program = textwrap.dedent(f"""
        import asyncio, ctypes, os, signal, time
        from pathlib import Path
        from rlsdk import RolloutConfig
        from rlsdk.engines.launch import process_group
        from rlsdk.engines.launch.sglang import SGLangLauncher, plan_launch
        ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans come to this process, unreaped
        launcher = SGLangLauncher(plan_launch(RolloutConfig(sglang_python={fake_python!r}), "/m"), Path({str(tmp_path)!r}))
        asyncio.run(launcher.start())
        server, worker = (int(p) for p in Path({str(pids_file)!r}).read_text().split())
        os.kill(server, signal.SIGKILL)
        while launcher.exited() is None:
            time.sleep(0.05)
        while Path(f"/proc/{{worker}}/stat").read_text().split(") ")[1][0] != "Z":
            time.sleep(0.05)  # the worker's parent-death signal
        print(process_group._group_alive(server), flush=True)
        launcher.stop()
        os.waitpid(worker, 0)
    """)
    env = {**os.environ, "FAKE_SGLANG_PIDS": str(pids_file)}
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, env=env, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
