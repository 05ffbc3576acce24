"""Stands in for the Python of vLLM's own environment where vLLM cannot run (no CUDA): the launch tests pass a
script running this file as ``--vllm-python``.

``-c CODE`` (rlsdk asking for vLLM's version) prints ``FAKE_VLLM_VERSION`` (default 0.26.0; ``none``: exits 1,
as a Python without vLLM). ``-m vllm.entrypoints.cli.main serve MODEL ...`` logs its pid, ``CUDA_VISIBLE_DEVICES``,
command line, what of its environment rlsdk sets, and whether rlsdk's worker extension imports; then, like a
real server, starts slowly (``FAKE_VLLM_DELAY`` seconds), forks a worker into its process group
(``FAKE_VLLM_PIDS``: a file that receives both pids; the worker exits when the server dies) and answers
``/health``, ``/v1/models`` (with the API key) and ``/is_paused`` on its ``--uds`` socket. With
``FAKE_VLLM_GENERATE`` set it serves everything :mod:`rlsdk_engine_vllm.stand_in` restates, in front of the
embedded engine on MODEL (CPU). ``FAKE_VLLM_EXIT`` makes it exit with that status during start-up instead, as
a server that cannot load its model does.
"""

import asyncio
import importlib.util
import os
import subprocess
import sys
import time

from aiohttp import web

WORKER = (
    "import ctypes, os, sys, time\n"
    "ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG: SIGKILL when the server dies\n"
    "if os.getppid() == int(sys.argv[1]):\n"
    "    time.sleep(600)\n"
)
SHOWN = (
    "CUDA_VISIBLE_DEVICES",
    "VLLM_SERVER_DEV_MODE",
    "VLLM_ALLOW_INSECURE_SERIALIZATION",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
    "PYTORCH_CUDA_ALLOC_CONF",
    "RLSDK_WEIGHT_CHECKSUMS",
    "FAKE_VLLM_GENERATE",
)


def serve(argv: list[str]) -> None:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    print(
        f"fake vllm serve starting (pid {os.getpid()}, CUDA_VISIBLE_DEVICES={visible}):",
        " ".join(argv),
        flush=True,
    )
    for name in SHOWN:
        print(f"env {name}={os.environ.get(name)}", flush=True)
    print(f"env VLLM_API_KEY set: {bool(os.environ.get('VLLM_API_KEY'))}", flush=True)
    print(
        f"worker extension importable: {importlib.util.find_spec('rlsdk_vllm_worker') is not None}",
        flush=True,
    )
    if code := os.environ.get("FAKE_VLLM_EXIT"):
        print("torch.OutOfMemoryError: CUDA out of memory (fake)", flush=True)
        sys.exit(int(code))
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(os.getpid())])
    if pids := os.environ.get("FAKE_VLLM_PIDS"):
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\n{worker.pid}\n")
    time.sleep(float(os.environ.get("FAKE_VLLM_DELAY", "0")))
    model, socket = argv[1], argv[argv.index("--uds") + 1]
    key = os.environ.get("VLLM_API_KEY")

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    async def models(request: web.Request) -> web.Response:
        if key and request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return web.json_response(
            {"object": "list", "data": [{"id": model, "object": "model", "root": model}]}
        )

    async def is_paused(request: web.Request) -> web.Response:
        return web.json_response({"is_paused": False})

    if os.environ.get("FAKE_VLLM_GENERATE"):
        from rlsdk_embedded.engine import EmbeddedEngine
        from rlsdk_engine_vllm.stand_in import FakeVLLM

        engine = EmbeddedEngine(model, device="cpu", threads=1)
        app = FakeVLLM(engine, model, api_key=key).app()

        async def start(app: web.Application) -> None:
            await engine.start()

        async def close(app: web.Application) -> None:
            await engine.close()

        app.on_startup.append(start)
        app.on_cleanup.append(close)
    else:
        app = web.Application()
        app.add_routes(
            [web.get("/health", health), web.get("/v1/models", models), web.get("/is_paused", is_paused)]
        )
    print("fake vllm serve ready", flush=True)
    web.run_app(app, path=socket, print=None)


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["-c"]:
        version = os.environ.get("FAKE_VLLM_VERSION", "0.26.0")
        if version == "none":
            sys.exit(1)
        print(version)
        return
    if args[:2] == ["-m", "vllm.entrypoints.cli.main"]:
        serve(args[2:])
        return
    sys.exit(f"fake vllm python: unexpected {args}")


if __name__ == "__main__":
    asyncio.set_event_loop(asyncio.new_event_loop())
    main()
