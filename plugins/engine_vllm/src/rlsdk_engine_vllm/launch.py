"""``--engine vllm`` without ``--vllm-url``: rlsdk starts ``vllm serve`` itself, from ``--vllm-python``.

One server, tensor parallel over ``rollout_num_gpus_per_engine`` GPUs (the trainer's with ``--colocate``,
else the ones after them), listening on a Unix socket in a private folder: vLLM's RL routes (weight
updates that unpickle what they are sent, ``/collective_rpc``) take no token (its ``--api-key`` guards
``/v1`` only), so no TCP port, which any local process or a browser's page could reach, is opened. Its
environment: ``VLLM_SERVER_DEV_MODE=1`` (the RL routes), ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` with the
IPC transfer (CUDA-IPC handles arrive pickled), ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`` with ``--lora-rank``,
a fresh ``VLLM_API_KEY``, no allocator settings of the trainer's (vLLM's sleep mode cannot work with
expandable segments), NCCL without its cuMem allocator unless set (the trainer's side of a weight broadcast
has it off), and the folder of rlsdk's worker extension (:mod:`rlsdk_vllm_worker`) first on its
``PYTHONPATH``. The server runs in a process group of its own that is stopped whole, and gets SIGTERM when
rlsdk dies (:class:`rlsdk.ManagedProcess`). Start-up waits for ``/health`` with a timeout; every error
names the log.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from rlsdk.engine_api import EngineError, tensor_checksum
from rlsdk.trainer_api import ManagedProcess, trainer_world_size

VLLM_VERSION = "0.26"
"""The vLLM release whose routes and shapes the client speaks."""
WORKER_EXTENSION = "rlsdk_vllm_worker.WeightChecksums"
WORKER_FOLDER = Path(__file__).with_name("vllm_side")
"""The folder of :mod:`rlsdk_vllm_worker`, put on the server's ``PYTHONPATH`` (nothing else of rlsdk's)."""
CHECKSUMS_ENV = "RLSDK_WEIGHT_CHECKSUMS"
"""The file of rlsdk's checksum algorithm (standard library and torch only), which the worker extension loads."""
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``--max-lora-rank`` values vLLM 0.26 accepts."""
COLOCATED_MEMORY = "0.5"
"""``--gpu-memory-utilization`` of a colocated server unless ``--vllm-args`` sets it (vLLM's 0.92 leaves
the trainer no room while the engine is awake)."""

SET_BY_RLSDK = {
    "--uds": "nothing (rlsdk serves it on a private socket)",
    "--host": "nothing (rlsdk serves it on a private socket)",
    "--port": "nothing (rlsdk serves it on a private socket)",
    "--tensor-parallel-size": "--rollout-num-gpus-per-engine",
    "-tp": "--rollout-num-gpus-per-engine",
    "--seed": "--rollout-seed",
    "--logprobs-mode": "nothing (processed_logprobs: the log-probs of the temperature the trainer uses)",
    "--worker-extension-cls": "nothing (rlsdk's, for the weights check)",
    "--weight-transfer-config": "--weight-sync",
    "--enable-sleep-mode": "--colocate",
    "--enable-lora": "--lora-rank",
    "--max-lora-rank": "--lora-rank",
    "--api-key": "nothing (rlsdk makes one)",
}
"""``vllm serve`` flags rlsdk sets from its own options: given in ``--vllm-args``, an error naming the option."""


class VLLMLaunchError(EngineError):
    """A launched vLLM server failed to start, or died."""


@dataclass
class Plan:
    """The server's command line and environment, before anything starts (what the tests check)."""

    command: list[str]
    gpus: list[int]
    transfer: str | None
    env: dict[str, str] = field(default_factory=dict)


def weight_transfer(args: Any) -> str | None:
    """vLLM's weight-transfer backend for the run's ``weight_sync``: ``ipc`` colocated (``auto`` or
    ``tensor``, no LoRA), ``nccl`` for ``--weight-sync nccl``, else none (disk syncs need none)."""
    mode = getattr(args, "weight_sync", "auto")
    if mode == "nccl":
        return "nccl"
    if mode == "tensor" or (mode == "auto" and args.colocate and not getattr(args, "lora_rank", 0)):
        return "ipc"
    return None


def extra_flags(text: str | None) -> list[str]:
    """``--vllm-args`` as flags; one rlsdk sets itself is a ValueError naming the option to use."""
    flags = shlex.split(text or "")
    for flag in flags:
        name = flag.split("=", 1)[0]
        if name in SET_BY_RLSDK:
            raise ValueError(f"--vllm-args {name}: rlsdk sets it itself; use {SET_BY_RLSDK[name]}")
    return flags


def lora_rank_flag(rank: int) -> str:
    """The smallest ``--max-lora-rank`` vLLM takes that holds ``rank``."""
    fitting = [r for r in LORA_RANKS if r >= rank]
    if not fitting:
        raise ValueError(f"--lora-rank {rank}: vLLM 0.26 serves adapters of rank at most {LORA_RANKS[-1]}")
    return str(fitting[0])


def visible_gpus() -> list[str]:
    """This process's GPUs as ``CUDA_VISIBLE_DEVICES`` names them (numbers from 0 when it is unset)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip()]
    return [str(i) for i in range(64)]


def check_launch(args: Any) -> None:
    """A ValueError with a one-line reason for what a launched server cannot be given, before anything starts:
    no model folder, several servers outside Ray, a flag of ``--vllm-args`` rlsdk sets itself, a LoRA rank
    vLLM cannot serve, and (outside Ray, where ``--vllm-python`` is each node's) an interpreter without
    vLLM 0.26."""
    model = model_folder(args)
    python = vllm_python(args)
    plan = plan_server(args, model, "vllm.sock", python)
    if not getattr(args, "ray_address", None):
        server_environment(plan, "", bool(getattr(args, "lora_rank", 0)))  # the GPUs it needs are visible
        if problem := vllm_python_problem(python):
            raise ValueError(problem)


def model_folder(args: Any) -> str:
    """The model a launched server serves (``--hf-checkpoint``, else ``--model``), absolute where it exists
    (the server runs in the log folder)."""
    model = args.hf_checkpoint or args.model
    if not model:
        raise ValueError(
            "the vllm engine without --vllm-url launches vLLM: pass --hf-checkpoint (the model folder)"
        )
    return str(Path(model).resolve()) if Path(model).exists() else str(model)


def vllm_python(args: Any) -> str:
    """The interpreter that launches the server: ``--vllm-python``, else this one."""
    return getattr(args, "vllm_python", None) or sys.executable


def check_one_server(args: Any) -> None:
    """A ValueError unless ``args`` ask for one server: on Ray each engine actor launches one."""
    per_engine = args.rollout_num_gpus_per_engine
    total = args.rollout_num_gpus or per_engine
    if total != per_engine and not getattr(args, "ray_address", None):
        raise ValueError(
            f"the vllm engine launches one vLLM server (tensor parallel over --rollout-num-gpus-per-engine "
            f"{per_engine} GPUs), not {total // max(per_engine, 1)}: run several as Ray engine actors "
            "(--ray-address), or pass --vllm-url of a server you started"
        )


def plan_server(args: Any, model: str, socket: str, python: str) -> Plan:
    """The ``vllm serve`` of ``args``: model, socket, GPUs, seed, and the flags its features need."""
    check_one_server(args)
    per_engine = args.rollout_num_gpus_per_engine
    first = 0 if args.colocate or not args.train else trainer_world_size(args)
    gpus = list(range(first, first + per_engine))
    flags = extra_flags(getattr(args, "vllm_args", None))
    command = [
        python,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        model,
        "--uds",
        socket,
        "--tensor-parallel-size",
        str(per_engine),
        "--seed",
        str(args.rollout_seed + getattr(args, "rollout_engine_index", 0)),
        "--logprobs-mode",
        "processed_logprobs",
        "--worker-extension-cls",
        WORKER_EXTENSION,
    ]
    if args.colocate:
        command.append("--enable-sleep-mode")
        if not any(f.split("=", 1)[0] == "--gpu-memory-utilization" for f in flags):
            command += ["--gpu-memory-utilization", COLOCATED_MEMORY]
    transfer = weight_transfer(args)
    if transfer:
        command += ["--weight-transfer-config", json.dumps({"backend": transfer})]
    if getattr(args, "lora_rank", 0):
        command += ["--enable-lora", "--max-lora-rank", lora_rank_flag(args.lora_rank)]
    return Plan(command + flags, gpus, transfer)


def server_environment(plan: Plan, api_key: str, lora: bool) -> dict[str, str]:
    """The server's environment (see the module's docstring)."""
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    env.setdefault("NCCL_CUMEM_ENABLE", "0")  # as the trainer's side of a weight broadcast has it
    visible = visible_gpus()
    if max(plan.gpus) >= len(visible):
        raise ValueError(f"the vllm engine needs GPUs {plan.gpus}; this process sees {len(visible)}")
    env["CUDA_VISIBLE_DEVICES"] = ",".join(visible[g] for g in plan.gpus)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env["VLLM_API_KEY"] = api_key
    if plan.transfer == "ipc":
        env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    if lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    env[CHECKSUMS_ENV] = inspect.getfile(tensor_checksum)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WORKER_FOLDER), env.get("PYTHONPATH")]))
    return env


def installed_version(python: str) -> str | None:
    """The vLLM version ``python`` imports (without importing it here); None when it has none."""
    probe = "import importlib.metadata as m; print(m.version('vllm'))"
    try:
        done = subprocess.run([python, "-c", probe], check=False, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def vllm_python_problem(python: str) -> str | None:
    """Why ``python`` cannot launch the server (no vLLM, or not 0.26), in one line; None when it can."""
    version = installed_version(python)
    if version is None:
        return (
            f"vLLM is not installed for {python}: pip install vllm=={VLLM_VERSION}.0 in an environment of its "
            "own and pass its python as --vllm-python, or pass --vllm-url of a running server"
        )
    if not version.startswith(VLLM_VERSION + "."):
        return f"{python} has vllm {version}; the vllm engine speaks vLLM {VLLM_VERSION}'s routes and shapes"
    return None


class VLLMLauncher:
    """Starts the planned server, waits until it answers, stops it (its whole process group)."""

    def __init__(self, args: Any, log_dir: Path, python: str | None = None) -> None:
        model = model_folder(args)
        self.python = python or vllm_python(args)
        self.folder = tempfile.mkdtemp(prefix="rlsdk-vllm-")  # 0700: this user only
        self.socket = str(Path(self.folder) / "vllm.sock")
        self.api_key = secrets.token_urlsafe(32)
        try:
            self.plan = plan_server(args, model, self.socket, self.python)
            env = server_environment(self.plan, self.api_key, bool(getattr(args, "lora_rank", 0)))
        except BaseException:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise
        self.startup_timeout = float(getattr(args, "vllm_startup_timeout", 900.0))
        self.plan.env = env
        index = getattr(args, "rollout_engine_index", 0)
        self.process = ManagedProcess(
            f"vLLM server {index} (GPUs {','.join(map(str, self.plan.gpus))})",
            self.plan.command,
            log_dir / f"vllm-server-{index}.log",
            env,
            cwd=log_dir,
        )

    def check_installed(self) -> None:
        """vLLM 0.26 is what ``--vllm-python`` imports (on Ray, this node's)."""
        if problem := vllm_python_problem(self.python):
            raise EngineError(problem)

    async def start(self) -> None:
        """Start the server and wait for ``/health``; on any failure stop it."""
        await asyncio.to_thread(self.check_installed)
        Path(self.folder).mkdir(mode=0o700, exist_ok=True)
        Path(self.socket).unlink(missing_ok=True)  # a stopped server's: vLLM binds the path afresh
        try:
            self.process.start()
            await self._wait_ready()
        except BaseException:
            await asyncio.to_thread(self.stop)
            raise

    async def _wait_ready(self) -> None:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=self.socket)) as session:
            await self.process.wait_answering(
                session,
                "http://localhost/health",
                timeout=self.startup_timeout,
                option="--vllm-startup-timeout",
                exited=VLLMLaunchError,
                waiting_for="answer /health",
            )

    def exited(self) -> str | None:
        """The server's exit status and log once it has exited; None while it runs."""
        code = self.process.exit_code()
        if code is None:
            return None
        return f"{self.process.name} exited with status {code}; log: {self.process.log_path}"

    def stop(self) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL) and remove its socket folder."""
        self.process.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
