"""What the Tinker API adds to a ``forward_backward``: the same call (LoRA, cross-entropy, ``--tokens`` tokens a
call in datums of ``--datum-tokens``) made through the real ``tinker`` client against ``rlsdk tinker serve``
running in another process (HTTP on loopback, protobuf, the future's long poll), and made in process on the
same kind of model by rlsdk's trainer directly (:class:`rlsdk.tinker.training.TrainingRun`, what the server
calls). Each side runs ``--calls`` timed calls after one warm-up; the overhead is the difference of the
medians over the direct median (target: at most 10% at 8k tokens a call; hosted Tinker is reported at 4-9 s
fixed a call).

    python benchmarks/tinker_overhead.py [--model PATH] [--device cpu|cuda] [--tokens 8192] [--calls 5]

Prints one JSON object as its last line. The model defaults to SmolLM2-135M-Instruct (the embedded engine's).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import machine

NAME = "bench/model"


def timed(calls: int, run: object) -> list[float]:
    seconds = []
    for i in range(calls + 1):
        started = time.perf_counter()
        run()  # type: ignore[operator]
        if i:  # the first call warms up (allocations, kernels)
            seconds.append(time.perf_counter() - started)
    return seconds


def wait_ready(url: str, key: str, server: subprocess.Popen[bytes], log: Path, seconds: float = 600) -> None:
    """Until the server answers its health check (it loads the model first)."""
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited ({server.returncode}): {log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/api/v1/healthz", headers={"X-API-Key": key}, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server did not answer within {seconds:.0f}s: {log.read_text()[-3000:]}")


def measure_direct(folder: Path, args: argparse.Namespace, data: list[object]) -> list[float]:
    """Seconds of each timed ``forward_backward`` on the trainer in this process (freed afterwards)."""
    import torch

    from rlsdk.tinker.training import LoraSpec, Placement, TrainingRun

    run = TrainingRun(folder, LoraSpec(args.rank, seed=0), Placement(args.device, args.dtype))

    def call() -> None:
        run.forward_backward(data, "cross_entropy", {}, True)  # type: ignore[arg-type]
        if args.device == "cuda":
            torch.cuda.synchronize()

    seconds = timed(args.calls, call)
    run.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="a local model folder (default SmolLM2-135M-Instruct)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument(
        "--dtype", default="auto", help="the trainer's dtype (auto: float32 on CPU, bf16 on CUDA)"
    )
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--datum-tokens", type=int, default=512)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--rank", type=int, default=32)
    args = parser.parse_args()
    if args.calls < 5:
        parser.error("--calls: at least 5 (a ratio from fewer is noise)")

    import numpy as np
    import tinker
    import torch
    from tinker import types

    from rlsdk.tinker.wire import Datum

    folder = args.model
    if folder is None:
        from rlsdk_embedded.model_files import default_model_path

        folder = default_model_path()
    count = max(1, args.tokens // args.datum_tokens)
    rng = np.random.default_rng(0)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    rows = [rng.integers(0, vocab, args.datum_tokens + 1) for _ in range(count)]

    # in process: the trainer the server runs, called directly
    direct_data = [
        Datum(row[:-1], {"target_tokens": row[1:], "weights": np.ones(args.datum_tokens, np.float32)})
        for row in rows
    ]
    direct_seconds = measure_direct(folder, args, direct_data)

    # through the API: the server in a process of its own, the real client here
    key = f"tml-{secrets.token_urlsafe(16)}"
    port = 8000 + secrets.randbelow(2000)
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"tinker-overhead-{port}"
    scratch.mkdir(parents=True, exist_ok=True)
    log = (scratch / "server.log").open("w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlsdk_cli.app",
            "tinker",
            "serve",
            "--model",
            f"{NAME}={folder}",
            "--port",
            str(port),
            "--api-key",
            key,
            "--train-device",
            args.device,
            "--train-dtype",
            args.dtype,
            "--checkpoint-dir",
            str(scratch / "checkpoints"),
            "--set",
            f"engine_device={args.device}",
        ],
        stderr=log,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, key, server, scratch / "server.log")
        client = tinker.ServiceClient(base_url=url, api_key=key)
        trainer = client.create_lora_training_client(base_model=NAME, rank=args.rank, seed=0).result()
        api_data = [
            types.Datum(
                model_input=types.ModelInput.from_ints(row[:-1].tolist()),
                loss_fn_inputs={"target_tokens": row[1:].tolist(), "weights": [1.0] * args.datum_tokens},
            )
            for row in rows
        ]
        api_seconds = timed(args.calls, lambda: trainer.forward_backward(api_data, "cross_entropy").result())
        client.close("success").result()
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
    direct_median, api_median = statistics.median(direct_seconds), statistics.median(api_seconds)
    overhead = (api_median - direct_median) / direct_median
    report = {
        "benchmark": "tinker_overhead",
        "model": str(folder),
        "device": args.device,
        "tokens_per_call": count * args.datum_tokens,
        "datums_per_call": count,
        "lora_rank": args.rank,
        "calls": args.calls,
        "direct_seconds": direct_seconds,
        "api_seconds": api_seconds,
        "direct_median_s": direct_median,
        "api_median_s": api_median,
        "overhead_s": api_median - direct_median,
        "overhead_share": overhead,
        "ratio": direct_median / api_median,
        "meets_target": overhead <= 0.10,
        "machine": {**machine(), "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None},
        "tinker": tinker.__version__,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
