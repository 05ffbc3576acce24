"""``engine: sglang`` without a URL: rlsdk starts the SGLang servers itself, as slime does.

``rollout_num_gpus / rollout_num_gpus_per_engine`` servers (``python -m sglang.launch_server``), each on
its own GPUs (``--base-gpu-id``, ``--tp-size``), and with more than one an ``sglang_router`` in front; the
client talks to the router (or the single server). Options follow slime's: every ``sglang_<name>`` option
becomes the server flag ``--<name>``, except those rlsdk sets itself (:data:`SET_BY_RLSDK`), and every
``router_<name>`` the router's ``--<name>`` (slime's load-balance thresholds by default). Start-up waits
for each server's ``/health_generate`` (a real one-token generation), then for the router to list every
server at ``/workers``, with a timeout; every error names the process's log.
Never imports sglang: the servers run in their own processes (``sglang_python`` may be another interpreter).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from ...training_options import trainer_world_size
from ..protocol import EngineError
from .arguments import CLIENT_OPTIONS
from .process_group import ManagedProcess, free_port
from ...options import RunOptions


SET_BY_RLSDK = {
    "model_path": "--hf-checkpoint / --model",
    "host": "sglang_router_ip",
    "port": "sglang_router_port (the router's, or the one server's)",
    "tp_size": "--rollout-num-gpus-per-engine",
    "tensor_parallel_size": "--rollout-num-gpus-per-engine",
    "base_gpu_id": "--rollout-num-gpus and --colocate",
    "enable_memory_saver": "--colocate",
}
"""Server flags rlsdk derives from its own options; a ``sglang_<name>`` for one of them is an error
naming the option to use instead (as slime skips them)."""

ROUTER_DEFAULTS = {
    "router_balance_abs_threshold": 10,
    "router_balance_rel_threshold": 1.2,
    "router_disable_health_check": True,
    "router_disable_circuit_breaker": True,
    "router_request_timeout_secs": 14400,
    "router_log_level": "warn",
}
"""slime's router settings. The cache-aware policy falls back to the least-loaded worker once in-flight
requests differ by 10 and by 20% (sglang-router's own 64 and 50% let one engine take half as many again as
the other). The router's health checks and circuit breaker are off: a server busy with hundreds of requests
answers ``/health`` late and would be taken out of rotation (every request then fails with 503); rlsdk
watches the servers itself. Requests may take 4 hours; the router logs warnings only (not every request)."""

ROUTER_SET_BY_RLSDK = {
    "router_host": "sglang_router_ip",
    "router_port": "sglang_router_port",
    "router_worker_urls": "--rollout-num-gpus",
}
"""Router flags rlsdk derives from its own options; a ``router_<name>`` for one of them is an error naming
the option to use instead."""


class SGLangLaunchError(EngineError):
    """A launched SGLang server or router failed to start, or died."""


def server_flags(options: Mapping[str, Any]) -> list[str]:
    """The server flags of every ``sglang_<name>`` in ``options`` (config fields and extra keys).

    ``True`` gives a bare ``--name``, ``False`` and ``None`` nothing, a list its values after one flag."""
    servers = {k: v for k, v in options.items() if k not in CLIENT_OPTIONS}
    refused = {f"sglang_{name}": use for name, use in SET_BY_RLSDK.items()}
    return _flags(servers, "sglang_", refused, "server")


def router_flags(options: Mapping[str, Any]) -> list[str]:
    """The router flags of every ``router_<name>`` in ``options`` over :data:`ROUTER_DEFAULTS` (slime's
    ``--router-*`` options: ``router_policy``, ``router_balance_abs_threshold``, ...)."""
    return _flags({**ROUTER_DEFAULTS, **options}, "router_", ROUTER_SET_BY_RLSDK, "router")


def _flags(options: Mapping[str, Any], prefix: str, refused: Mapping[str, str], whose: str) -> list[str]:
    flags: list[str] = []
    for key, value in options.items():
        if not key.startswith(prefix) or value is None or value is False:
            continue
        flag = "--" + key.removeprefix(prefix).replace("_", "-")
        if key in refused:
            raise ValueError(f"{key}: rlsdk sets the {whose}'s {flag} itself; use {refused[key]}")
        flags.append(flag)
        if isinstance(value, list | tuple):
            flags.extend(str(v) for v in value)
        elif value is not True:
            flags.append(str(value))
    return flags


def prefixed_options(args: RunOptions, prefix: str) -> dict[str, Any]:
    """``args``' options named ``<prefix>...``: the fields (``sglang_mem_fraction_static``, ...) and extra
    keys."""
    options = {**vars(args), **getattr(args, "extra", {})}
    return {k: v for k, v in options.items() if k.startswith(prefix)}


@dataclass
class EnginePlan:
    """One server: its command line and where it listens."""

    index: int
    port: int
    gpus: list[int]
    command: list[str]


@dataclass
class LaunchPlan:
    """Every process of a launch, before anything starts (what the tests check)."""

    host: str
    engines: list[EnginePlan]
    router_port: int | None
    router_command: list[str] | None

    @property
    def url(self) -> str:
        port = self.router_port if self.router_command else self.engines[0].port
        return f"http://{self.host}:{port}"

    @property
    def worker_urls(self) -> list[str]:
        """The servers' addresses, as the router is given them."""
        return [f"http://{self.host}:{e.port}" for e in self.engines]


def plan_launch(
    args: RunOptions, model_path: str, python: str | None = None, ports: Sequence[int] | None = None
) -> LaunchPlan:
    """The servers (and router) ``args`` ask for. ``ports`` (servers', then the router's) default to free ones."""
    python = python or args.sglang_python or sys.executable
    per_engine = args.rollout_num_gpus_per_engine
    total = args.rollout_num_gpus or per_engine
    if per_engine < 1 or total < 1 or total % per_engine:
        raise ValueError(
            f"--rollout-num-gpus ({total}) must be a positive multiple of "
            f"--rollout-num-gpus-per-engine ({per_engine})"
        )
    count = total // per_engine
    host = args.sglang_router_ip or "127.0.0.1"
    if (
        ports is None
    ):  # a given sglang_router_port is the address clients use: the router's, or the one server's
        ports = [free_port(host) for _ in range(count)] + ([free_port(host)] if count > 1 else [])
        if count == 1 and args.sglang_router_port:
            ports = [args.sglang_router_port]
    ports = list(ports)
    # Colocated engines share GPUs 0.. with the trainer; otherwise they start after the trainer's.
    first_gpu = 0 if args.colocate else trainer_gpu_count(args)
    flags = server_flags(prefixed_options(args, "sglang_"))
    if args.colocate:
        flags.append("--enable-memory-saver")
    flags.extend(lora_flags(args, flags))
    engines = []
    for i in range(args.rollout_engine_index, args.rollout_engine_index + count):
        local = i - args.rollout_engine_index
        gpus = list(range(first_gpu + local * per_engine, first_gpu + (local + 1) * per_engine))
        command = [
            python,
            "-m",
            "sglang.launch_server",
            "--model-path",
            model_path,
            "--host",
            host,
            "--port",
            str(ports[local]),
            "--tp-size",
            str(per_engine),
            "--base-gpu-id",
            str(gpus[0]),
            "--random-seed",
            str(args.rollout_seed + i),
            *flags,
        ]
        engines.append(EnginePlan(i, ports[local], gpus, command))
    if count == 1:
        return LaunchPlan(host, engines, None, None)
    plan = LaunchPlan(host, engines, args.sglang_router_port or ports[count], None)
    plan.router_command = [
        python,
        "-m",
        "sglang_router.launch_router",
        "--host",
        host,
        "--port",
        str(plan.router_port),
        "--worker-urls",
        *plan.worker_urls,
        *router_flags(prefixed_options(args, "router_")),
    ]
    return plan


def lora_flags(args: RunOptions, flags: list[str]) -> list[str]:
    """With ``lora_rank``: ``--enable-lora`` and the rank and target modules adapters will have (SGLang
    sizes its adapter memory at launch), unless the ``sglang_*`` options set them."""
    if not getattr(args, "lora_rank", 0) or "--enable-lora" in flags:
        return []
    targets = list(args.lora_target_modules) if args.lora_target_modules else ["all"]
    return ["--enable-lora", "--max-lora-rank", str(args.lora_rank), "--lora-target-modules", *targets]


def trainer_gpu_count(args: RunOptions) -> int:
    """GPUs the trainer holds when not colocated: ``actor_num_gpus_per_node`` (default one per model-parallel
    rank of one data-parallel replica), and none without ``train``."""
    if not args.train:
        return 0
    return trainer_world_size(args)


def server_environment() -> dict[str, str]:
    """The servers' environment: SGLang's memory saver cannot work with expandable segments (as slime
    notes), so the trainer's allocator settings are not inherited; and NCCL without its cuMem allocator
    (``NCCL_CUMEM_ENABLE=0`` unless set), as the trainer's side of a weight broadcast uses it
    (:func:`rlsdk.engines.tensor_transport.init_broadcast_group`)."""
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    env.setdefault("NCCL_CUMEM_ENABLE", "0")
    return env


class SGLangLauncher:
    """Starts the planned processes, waits until each answers, stops them all (no orphans)."""

    def __init__(self, plan: LaunchPlan, log_dir: Path, startup_timeout: float = 900.0) -> None:
        self.plan = plan
        self.startup_timeout = startup_timeout
        env = server_environment()
        self.servers = [
            ManagedProcess(
                f"SGLang server {e.index} (GPUs {','.join(map(str, e.gpus))}, port {e.port})",
                e.command,
                log_dir / f"sglang-server-{e.index}.log",
                env,
                cwd=log_dir,
            )
            for e in plan.engines
        ]
        self.router = (
            ManagedProcess(
                f"sglang-router (port {plan.router_port})",
                plan.router_command,
                log_dir / "sglang-router.log",
                env,
                cwd=log_dir,
            )
            if plan.router_command
            else None
        )

    @property
    def url(self) -> str:
        return self.plan.url

    @property
    def processes(self) -> list[ManagedProcess]:
        return [*self.servers, *([self.router] if self.router else [])]

    async def start(self) -> None:
        """Start the servers together, wait for each to generate, then the router; on any failure stop all."""
        try:
            for server in self.servers:
                server.start()
            async with aiohttp.ClientSession() as session:
                await asyncio.gather(
                    *(
                        self._wait_ready(
                            session, server, f"http://{self.plan.host}:{e.port}", "/health_generate"
                        )
                        for server, e in zip(self.servers, self.plan.engines, strict=True)
                    )
                )
                if self.router is not None:
                    self.router.start()
                    await self._wait_ready(
                        session, self.router, self.url, "/workers", self._lists_all_workers
                    )
                await self._check_model_info(session)
        except BaseException:
            await asyncio.to_thread(self.stop)
            raise

    async def _wait_ready(
        self,
        session: aiohttp.ClientSession,
        process: ManagedProcess,
        url: str,
        path: str,
        ready: Callable[[aiohttp.ClientResponse], Awaitable[bool]] | None = None,
    ) -> None:
        """Until ``url + path`` answers 200 (or ``ready`` of the answer holds), or the process exits, or the
        start-up timeout passes."""
        await process.wait_answering(
            session,
            url + path,
            timeout=self.startup_timeout,
            option="--sglang-startup-timeout",
            exited=SGLangLaunchError,
            ready=ready,
            waiting_for=f"{'list every server at' if ready else 'answer'} {path}",
        )

    async def _lists_all_workers(self, response: aiohttp.ClientResponse) -> bool:
        """Whether the router's ``GET /workers`` lists every server, none unhealthy. sglang-router (0.3)
        answers ``/health`` at once and registers its ``--worker-urls`` in the background; until then it
        answers requests with 503 and lists fewer workers (whom weight updates would miss). A router
        without ``/workers`` (404) registered them before it answered."""
        if response.status == 404:
            return True
        if response.status != 200:
            return False
        try:
            listed = (await response.json(content_type=None)).get("workers", [])
            healthy = {w["url"].rstrip("/") for w in listed if w.get("is_healthy", True)}
        except (ValueError, AttributeError, KeyError, TypeError, aiohttp.ClientError):
            return False
        return healthy >= set(self.plan.worker_urls)

    async def _check_model_info(self, session: aiohttp.ClientSession) -> None:
        """Every server serves a generation model (``/get_model_info``, which 0.5.17 still answers)."""
        for server, engine in zip(self.servers, self.plan.engines, strict=True):
            async with session.get(f"http://{self.plan.host}:{engine.port}/get_model_info") as response:
                info = await response.json(content_type=None) if response.status == 200 else {}
            if info.get("is_generation") is False:
                raise SGLangLaunchError(
                    f"{server.name} serves {info.get('model_path')!r}, which is not a "
                    f"generation model; log: {server.log_path}"
                )

    def exited(self) -> str | None:
        """The first launched process that has exited since :meth:`start` (status and log); None while all
        run."""
        for process in self.processes:
            code = process.exit_code()
            if code is not None:
                return f"{process.name} exited with status {code}; log: {process.log_path}"
        return None

    def stop(self) -> None:
        """Stop the router, then the servers (each process group: SIGTERM, then SIGKILL)."""
        for process in reversed(self.processes):
            process.stop()


def has_module(python: str, module: str) -> bool:
    """Whether ``python`` can import ``module`` (without importing it here)."""
    check = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        return (
            subprocess.run([python, "-c", check], check=False, capture_output=True, timeout=60).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def launcher_for(args: RunOptions, log_dir: Path) -> SGLangLauncher:
    """The launcher for ``args``: checks that SGLang (and the router, for several engines) is installed."""
    model = args.hf_checkpoint or args.model
    if not model:
        raise ValueError(
            "engine sglang without --sglang-url launches SGLang: pass --hf-checkpoint (the model "
            "folder to serve)"
        )
    if Path(model).exists():  # the servers run in the log folder: a relative path would not reach the model
        model = str(Path(model).resolve())
    plan = plan_launch(args, model)
    python = plan.engines[0].command[0]
    if not has_module(python, "sglang"):
        raise EngineError(
            f"SGLang is not installed for {python}: pip install sglang==0.5.17 there (needs a "
            "CUDA GPU), or pass --sglang-url of a running server"
        )
    if plan.router_command and not has_module(python, "sglang_router"):
        raise EngineError(
            f"{len(plan.engines)} engines need sglang-router in front: pip install sglang-router "
            f"for {python}, or launch one engine (--rollout-num-gpus "
            f"{args.rollout_num_gpus_per_engine})"
        )
    return SGLangLauncher(plan, log_dir, args.sglang_startup_timeout)
