"""Stands in for ``python -m sglang.launch_server`` (and ``-m sglang_router.launch_router``) where SGLang
cannot run (no CUDA): launch tests pass this file as ``sglang_python``.

Like a real server it starts slowly (``FAKE_SGLANG_DELAY`` seconds, logging as it goes), forks a worker
into its process group (``FAKE_SGLANG_PIDS``: a file that receives both pids; the worker, as SGLang's do,
exits when the server dies) and then answers
``/health``, ``/health_generate`` and ``/get_model_info`` on ``--host``/``--port``. ``FAKE_SGLANG_EXIT``
makes it exit with that status during start-up instead, as a server that cannot load its model does.
``-c CODE`` (rlsdk asking whether sglang is importable) succeeds.

For runs through it (``FAKE_SGLANG_GENERATE`` set; otherwise the health check's generation fails),
``/generate`` answers in SGLang's shape (rlsdk's own :func:`generate_response`) with
``max_new_tokens`` token ids derived from the prompt's, after ``FAKE_SGLANG_GENERATE_DELAY`` seconds
(default 0.05), and with ``logprob_start_len`` (the trust check's scoring) log-prob -1 for each input
token after that range's first; the control endpoints (abort, pause, continue, flush, weights from disk) answer success
and log their path and body.
Its start-up line shows ``CUDA_VISIBLE_DEVICES``, as Ray set it for an engine actor.
``FAKE_SGLANG_HEALTH_DELAY`` seconds pass before it answers ``/health``, as a real server swamped with
requests can answer late.

As the router, it answers ``/health`` at once and, like sglang-router 0.3, registers its ``--worker-urls``
in the background: ``GET /workers`` lists them only ``FAKE_ROUTER_REGISTER_DELAY`` seconds (default 0)
after it is up.
"""

import asyncio
import os
import subprocess
import sys
import time

from aiohttp import web


WORKER = (
    "import ctypes, os, sys, time\n"
    "ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG: SIGKILL when the server dies\n"
    "if os.getppid() == int(sys.argv[1]):  # else the server died before the line above\n"
    "    time.sleep(600)\n"
)
"""The server's worker process: like SGLang's (which watch their parent), it ends when the server does, even
when the server was SIGKILLed (a worker that slept 600 s outlived the tests that killed servers)."""


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["-c"]:
        return
    module = argv[1] if argv[:1] == ["-m"] else "?"
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
    print(
        f"fake {module} starting: {' '.join(argv)} (pid {os.getpid()}, CUDA_VISIBLE_DEVICES={gpus})",
        flush=True,
    )
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(os.getpid())])
    if os.environ.get("FAKE_SGLANG_PIDS"):
        with open(os.environ["FAKE_SGLANG_PIDS"], "a") as f:
            f.write(f"{os.getpid()} {worker.pid}\n")
    time.sleep(float(os.environ.get("FAKE_SGLANG_DELAY", "0")))
    if os.environ.get("FAKE_SGLANG_EXIT"):
        print("RuntimeError: CUDA out of memory (fake)", flush=True)
        sys.exit(int(os.environ["FAKE_SGLANG_EXIT"]))

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def model_info(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": flag(argv, "--model-path") if "--model-path" in argv else "",
                "is_generation": True,
            }
        )

    async def success(request: web.Request) -> web.Response:
        print(request.path, await request.text(), flush=True)
        return web.json_response({"success": True, "message": ""})

    up = time.monotonic()

    async def workers(request: web.Request) -> web.Response:
        registered = time.monotonic() - up >= float(os.environ.get("FAKE_ROUTER_REGISTER_DELAY", "0"))
        urls = argv[argv.index("--worker-urls") + 1 :] if registered else []
        urls = urls[: next((i for i, u in enumerate(urls) if u.startswith("--")), len(urls))]
        return web.json_response({"workers": [{"url": u, "is_healthy": True} for u in urls]})

    app = web.Application()
    if module == "sglang_router.launch_router":
        app.router.add_get("/workers", workers)
    async def health(request: web.Request) -> web.Response:
        await asyncio.sleep(float(os.environ.get("FAKE_SGLANG_HEALTH_DELAY", "0")))
        return web.Response(text="")

    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", ok)
    app.router.add_get("/get_model_info", model_info)
    if os.environ.get("FAKE_SGLANG_GENERATE"):
        app.router.add_post("/generate", generate)
    app.router.add_get("/flush_cache", ok)
    for path in ("/abort_request", "/pause_generation", "/continue_generation", "/update_weights_from_disk"):
        app.router.add_post(path, success)
    print("fake server ready", flush=True)
    asyncio.run(serve(app, flag(argv, "--host"), int(flag(argv, "--port"))))


async def generate(request: web.Request) -> web.Response:
    """``max_new_tokens`` ids from the prompt's, each with log-prob -1, finished by length."""
    from rlsdk.engines.protocol import generate_response

    body = await request.json()
    await asyncio.sleep(float(os.environ.get("FAKE_SGLANG_GENERATE_DELAY", "0.05")))
    prompt = body.get("input_ids") or [0]
    count = int(body.get("sampling_params", {}).get("max_new_tokens", 1))
    ids = [(sum(prompt) + k) % 97 + 3 for k in range(count)]
    response = generate_response(
        rid=body.get("rid") or "fake",
        text="".join(f" t{i}" for i in ids),
        output_ids=ids,
        prompt_tokens=len(prompt),
        finish_reason={"type": "length", "length": count},
        weight_version="default",
        logprobs=[-1.0] * count,
    )
    if "logprob_start_len" in body:
        scored = prompt[int(body["logprob_start_len"]) :]
        response["meta_info"]["input_token_logprobs"] = [[None, scored[0], None]] + [
            [-1.0, token, None] for token in scored[1:]
        ]
    return web.json_response(response)


async def serve(app: web.Application, host: str, port: int) -> None:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    main()
