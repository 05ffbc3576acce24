"""``--engine vllm`` without ``--vllm-url``: the ``vllm serve`` command line and environment rlsdk builds from a
run's options, what it refuses before anything starts, and the server's life: started from ``--vllm-python``
(here ``fake_vllm_interpreter.py``: vLLM needs CUDA), reached on its private socket with its key, stopped as a
process group, and never outliving rlsdk."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rlsdk.testing import process_alive, processes_gone
from rlsdk import RolloutConfig, run_job
from rlsdk_cli.app import app
from typer.testing import CliRunner
from rlsdk.engine_api import EngineError, EngineUnavailableError, tensor_checksum

from rlsdk_engine_vllm.client import VLLMClient
from rlsdk_engine_vllm.launch import (
    WORKER_FOLDER,
    VLLMLauncher,
    VLLMLaunchError,
    plan_server,
    server_environment,
)
from rlsdk_engine_vllm.plugin import vllm_engine


def recorded_pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()]


def test_the_command_line_follows_the_runs_options():
    plain = plan_server(RolloutConfig(rollout_seed=7), "/m", "/s.sock", "py")
    assert plain.command == [
        "py", "-m", "vllm.entrypoints.cli.main", "serve", "/m", "--uds", "/s.sock", "--tensor-parallel-size", "1",
        "--seed", "7", "--logprobs-mode", "processed_logprobs",
        "--worker-extension-cls", "rlsdk_vllm_worker.WeightChecksums",
    ]  # fmt: skip
    assert plain.gpus == [0] and plain.transfer is None
    colocated = plan_server(RolloutConfig(colocate=True, train=True), "/m", "/s", "py")
    assert colocated.command[-5:] == [
        "--enable-sleep-mode", "--gpu-memory-utilization", "0.5", "--weight-transfer-config", '{"backend": "ipc"}'
    ]  # fmt: skip
    assert colocated.gpus == [0]
    apart = plan_server(
        RolloutConfig(
            train=True, weight_sync="nccl", rollout_num_gpus_per_engine=2, vllm_args="--max-model-len 4096"
        ),
        "/m",
        "/s",
        "py",
    )
    assert apart.gpus == [1, 2]  # after the trainer's GPU
    assert "--enable-sleep-mode" not in apart.command and apart.transfer == "nccl"
    assert apart.command[-4:] == [
        "--weight-transfer-config",
        '{"backend": "nccl"}',
        "--max-model-len",
        "4096",
    ]
    lora = plan_server(
        RolloutConfig(lora_rank=12, vllm_args="--gpu-memory-utilization=0.8", colocate=True), "/m", "/s", "py"
    )
    assert lora.command[-4:] == ["--enable-lora", "--max-lora-rank", "16", "--gpu-memory-utilization=0.8"]
    assert "0.5" not in lora.command and lora.transfer is None  # an adapter syncs through disk


REFUSED = [
    ({"vllm_args": "--seed 3"}, "--vllm-args --seed: rlsdk sets it itself; use --rollout-seed"),
    ({"vllm_args": "--enable-sleep-mode"}, "--vllm-args --enable-sleep-mode: .* use --colocate"),
    ({"rollout_num_gpus": 2}, "launches one vLLM server .* not 2: run several as Ray engine actors"),
    ({"lora_rank": 600}, "--lora-rank 600: vLLM 0.26 serves adapters of rank at most 512"),
    (
        {"colocate": True, "rollout_num_gpus_per_engine": 2, "rollout_num_gpus": 2},
        "CUDA-IPC sync with tensor parallel 2: .* use --weight-sync nccl",
    ),
    ({"env": "none"}, "vLLM is not installed for .*vllm-python: pip install vllm==0.26.0"),
    ({"env": "0.25.1"}, "has vllm 0.25.1; the vllm engine speaks vLLM 0.26's routes"),
]


@pytest.mark.parametrize(("options", "reason"), REFUSED, ids=lambda v: str(v)[:40])
def test_what_vllm_cannot_do_is_refused_in_one_line_before_anything_starts(
    options: dict, reason: str, fake_python, tiny_llama, tmp_path, monkeypatch
):
    options = dict(options)
    monkeypatch.setenv("FAKE_VLLM_VERSION", options.pop("env", "0.26.0"))
    monkeypatch.setenv("FAKE_VLLM_PIDS", str(tmp_path / "pids"))
    (tmp_path / "prompts.jsonl").write_text('{"input": "w1 w2"}\n')
    args = RolloutConfig(
        engine="vllm",
        hf_checkpoint=str(tiny_llama),
        prompt_data=str(tmp_path / "prompts.jsonl"),
        vllm_python=fake_python,
        output_dir=str(tmp_path / "out"),
        train=True,
        **options,
    )
    with pytest.raises(ValueError, match=reason) as refused:
        run_job(args)
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "pids").exists(), "a server started"
    assert not list(tmp_path.glob("out/logs/vllm-server-*.log"))


def test_the_command_line_says_the_refusal_and_starts_nothing(fake_python, tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_VERSION", "none")
    monkeypatch.setenv("FAKE_VLLM_PIDS", str(tmp_path / "pids"))
    command = ["run", "--engine", "vllm", "--vllm-python", fake_python, "--hf-checkpoint", str(tiny_llama)]
    done = CliRunner().invoke(app, [*command, "--output-dir", str(tmp_path / "out")], terminal_width=300)
    assert done.exit_code != 0
    assert f"vLLM is not installed for {fake_python}: pip install vllm==0.26.0" in done.output
    assert not (tmp_path / "pids").exists()


def test_the_servers_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.setenv("PYTHONPATH", "/carried/site")
    plan = plan_server(
        RolloutConfig(train=True, colocate=False, rollout_num_gpus_per_engine=2), "/m", "/s", "py"
    )
    env = server_environment(plan, "k", lora=True)
    assert env["CUDA_VISIBLE_DEVICES"] == "5,6"  # this process's GPUs 1 and 2
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_API_KEY"] == "k"
    assert (
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and "VLLM_ALLOW_INSECURE_SERIALIZATION" not in env
    )
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env and env["NCCL_CUMEM_ENABLE"] == "0"
    assert env["PYTHONPATH"] == f"{WORKER_FOLDER}{os.pathsep}/carried/site"
    colocated = plan_server(RolloutConfig(colocate=True), "/m", "/s", "py")
    assert server_environment(colocated, "k", lora=False)["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
    with pytest.raises(ValueError, match="needs GPUs \\[3, 4\\]; this process sees 3"):
        server_environment(
            plan_server(
                RolloutConfig(train=True, rollout_num_gpus_per_engine=2, actor_num_gpus_per_node=3),
                "/m",
                "/s",
                "py",
            ),
            "k",
            False,
        )


def test_the_worker_extension_loads_rlsdks_checksums_in_vllms_environment_without_rlsdk(tmp_path: Path):
    """With the extension's folder on the path (as rlsdk starts vLLM), the checksum file rlsdk points it at
    gives rlsdk's checksums, and no module of rlsdk's package is imported (vLLM's environment has none)."""
    import inspect

    program = textwrap.dedent("""
        import sys, torch, rlsdk_vllm_worker
        algorithm = rlsdk_vllm_worker._checksum_module()
        torch.manual_seed(0)
        print(algorithm.tensor_checksums([torch.randn(3, 5), torch.arange(7, dtype=torch.int16)]))
        print([name for name in sys.modules if name.startswith("rlsdk")])
    """)
    env = {
        **os.environ,
        "PYTHONPATH": str(WORKER_FOLDER),
        "RLSDK_WEIGHT_CHECKSUMS": inspect.getfile(tensor_checksum),
    }
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    sums, imported = done.stdout.splitlines()
    import torch

    torch.manual_seed(0)
    assert sums == str(
        [tensor_checksum(torch.randn(3, 5)), tensor_checksum(torch.arange(7, dtype=torch.int16))]
    )
    assert imported == "['rlsdk_vllm_worker', 'rlsdk_weight_checksums']"


def test_the_worker_extension_hashes_a_padded_vocabulary_without_its_padding():
    import torch

    sys.path.insert(0, str(WORKER_FOLDER))
    try:
        from rlsdk_vllm_worker import held_tensors
    finally:
        sys.path.remove(str(WORKER_FOLDER))

    class Embedding(torch.nn.Module):
        def __init__(self, rows: int, padded: int) -> None:
            super().__init__()
            self.org_vocab_size, self.num_embeddings_padded = rows, padded
            self.weight = torch.nn.Parameter(torch.randn(padded, 4))

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = Embedding(30, 64)
            self.proj = torch.nn.Linear(4, 4, bias=False)
            self.proj.base_layer = torch.nn.Linear(4, 4, bias=False)  # as a LoRA wrapper holds the base

    held = held_tensors(Model(), tp_size=1)
    assert held["embed_tokens.weight"].shape == (30, 4)
    assert "proj.weight" in held and not any(".base_layer." in name for name in held)


def test_a_launched_server_starts_answers_on_its_socket_and_stops_as_a_process_group(
    fake_python, tmp_path, monkeypatch
):
    monkeypatch.setenv("FAKE_VLLM_DELAY", "1")
    monkeypatch.setenv("FAKE_VLLM_PIDS", str(tmp_path / "pids"))
    args = RolloutConfig(
        hf_checkpoint=str(tmp_path), vllm_python=fake_python, output_dir=str(tmp_path / "out"), colocate=True
    )
    client = vllm_engine(args)
    assert (
        isinstance(client, VLLMClient) and client.url is None and client.http.socket == client.launcher.socket
    )

    async def scenario() -> dict:
        await client.start()
        try:
            return await client.model_info()
        finally:
            await client.close()

    info = asyncio.run(scenario())
    assert info["model_path"] == str(tmp_path)
    pids = recorded_pids(tmp_path / "pids")
    assert len(pids) == 2 and processes_gone(pids, timeout=5), "the server or its worker outlived close()"
    log = (tmp_path / "out" / "logs" / "vllm-server-0.log").read_text()
    assert "--enable-sleep-mode" in log and '{"backend": "ipc"}' in log
    assert "env VLLM_SERVER_DEV_MODE=1" in log and "env VLLM_ALLOW_INSECURE_SERIALIZATION=1" in log
    assert "env VLLM_API_KEY set: True" in log and "worker extension importable: True" in log
    assert not Path(client.launcher.folder).exists()  # its socket's folder went with it


def test_startup_problems_are_named_with_the_log(fake_python, tmp_path, monkeypatch):
    def launch(**env: str) -> None:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        launcher = VLLMLauncher(
            RolloutConfig(hf_checkpoint="/m", vllm_python=fake_python, vllm_startup_timeout=2.0), tmp_path
        )
        asyncio.run(launcher.start())

    with pytest.raises(
        EngineError, match="vLLM is not installed for .*vllm-python: pip install vllm==0.26.0"
    ):
        launch(FAKE_VLLM_VERSION="none")
    with pytest.raises(EngineError, match="has vllm 0.25.1; the vllm engine speaks vLLM 0.26's routes"):
        launch(FAKE_VLLM_VERSION="0.25.1")
    monkeypatch.setenv("FAKE_VLLM_VERSION", "0.26.0")
    with pytest.raises(
        VLLMLaunchError,
        match=r"exited with status 3 while starting; log: .*vllm-server-0.log\n(.|\n)*CUDA out of memory",
    ):
        launch(FAKE_VLLM_EXIT="3")
    monkeypatch.delenv("FAKE_VLLM_EXIT")
    with pytest.raises(
        EngineUnavailableError, match=r"did not answer /health within 2s \(--vllm-startup-timeout\)"
    ):
        launch(FAKE_VLLM_DELAY="60", FAKE_VLLM_PIDS=str(tmp_path / "pids"))
    assert processes_gone(recorded_pids(tmp_path / "pids"))


def test_a_killed_servers_exit_is_named_though_its_socket_refused_first(tmp_path):
    """The kernel closes a SIGKILLed server's socket a moment before its exit shows: the health check that
    finds the socket refusing waits for the exit and names it (what the restart path reports), not the refusal.
    The launcher here is a stand-in whose process shows its exit 0.3 s after the socket went."""

    class Dying:
        api_key = "k"
        stopped = False

        def __init__(self) -> None:
            self.gone_at = time.monotonic()

        def exited(self) -> str | None:
            if time.monotonic() - self.gone_at < 0.3:
                return None
            return "vLLM server 0 (GPUs 0) exited with status -9; log: vllm-server-0.log"

        def stop(self) -> None:
            self.stopped = True

    launcher = Dying()
    client = VLLMClient(socket=str(tmp_path / "gone.sock"), launcher=launcher)  # type: ignore[arg-type]
    client._launched = True  # as start() leaves it

    async def check() -> str | None:
        try:
            return await client.health_problem(timeout=1.0)
        finally:
            await client.close()

    assert asyncio.run(check()) == "vLLM server 0 (GPUs 0) exited with status -9; log: vllm-server-0.log"
    assert launcher.stopped


def test_no_server_outlives_a_killed_rlsdk(fake_python, tmp_path):
    program = textwrap.dedent(f"""
        import asyncio, time
        from pathlib import Path
        from rlsdk import RolloutConfig
        from rlsdk_engine_vllm.launch import VLLMLauncher
        launcher = VLLMLauncher(RolloutConfig(hf_checkpoint="/m", vllm_python={fake_python!r}), Path({str(tmp_path)!r}))
        asyncio.run(launcher.start())
        print("ready", flush=True)
        time.sleep(600)
    """)
    env = {**os.environ, "FAKE_VLLM_PIDS": str(tmp_path / "pids")}
    parent = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "ready"
        server, worker = recorded_pids(tmp_path / "pids")
        assert process_alive(server) and process_alive(worker)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        assert processes_gone([server, worker], timeout=10)
    finally:
        parent.kill()
        for pid in recorded_pids(tmp_path / "pids") if (tmp_path / "pids").exists() else []:
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_weight_transfer_json_is_what_vllm_parses():
    plan = plan_server(RolloutConfig(weight_sync="tensor", colocate=True), "/m", "/s", "py")
    config = json.loads(plan.command[plan.command.index("--weight-transfer-config") + 1])
    assert config == {"backend": "ipc"}  # vLLM's WeightTransferConfig(backend=...)
