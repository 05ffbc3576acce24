"""The GPU loop's checks on a real SGLang 0.5.17 (not run in CI; one device call per subcommand, each
under 9 minutes; the last line printed is one JSON object).

``throughput``: SGLang started by hand (``python -m sglang.launch_server``, the SGLang benchmark's flags)
and the same server started by rlsdk's launcher (``rlsdk.engines.launch.sglang``, the flags passed through as
``sglang_*`` options), one after the other on the same card; tokens/s of the shared workload (the straight
client with log-probs, as ``sglang_throughput.py``) on each, plus one ``rlsdk run`` rollout step through the
launched server. ``ratio`` = launched over hand-started (target >= 0.95). Start-up seconds of each.

``colocate``: random bf16 weights of the bench model in a Hugging Face folder; rlsdk launches SGLang on
it with ``colocate`` (memory saver); the torch trainer on the same GPU; per step: release SGLang's memory,
one train step on samples SGLang generated (random +-1 rewards), the colocated CUDA-IPC sync, the trust
check. Reported: sync seconds per step (target <= 0.15 s on one H100), release seconds, train seconds,
the trust check's seconds and log-prob differences (before any training, after training but before the
sync, after the sync), one sync through disk for comparison, and one more through sglang's own
serializer classes when sglang imports in this process.

``nccl``: the same with SGLang on GPU 1 and the trainer on GPU 0, weights broadcast through NCCL
(target <= 0.3 s a sync); needs two GPUs.

``colocate`` and ``nccl`` take ``--engine vllm``: vLLM 0.26 launched by the vllm engine plugin from
``--vllm-python`` (sleep mode, its IPC or NCCL weight transfer); each also reports the weights check after
the last sync (every tensor by checksum).

``engines2``: rlsdk's launcher with one engine (``rollout_num_gpus=1``), then with ``--engines`` (two by
default) behind the SGLang router (one GPU each), the same workload through the launched address (the
router's), with slime's concurrency per engine (``--in-flight`` requests at once per engine, and
``--requests`` per engine); ``ratio`` = many over one on the best of ``--repeat`` passes (target >= 1.9 for
two), ``median_ratio`` on their medians, with the launcher's router (cache-aware, slime's balance
thresholds), then ``ratios`` with each ``--router-policies`` policy; needs that many GPUs and sglang-router.

    PYTHONPATH=/tmp/rl:benchmarks/gpu python3 benchmarks/gpu/gpu_loop.py colocate \\
        --model-config .gpu/bench-model --sglang-python /tmp/sglang-python
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sglang_throughput import best, flush, straight, through_rlsdk
from workload import add_workload_options, machine, make_prompts, random_checkpoint, run_reporting, sample_groups, write_dataset

from rlsdk import RolloutConfig, Sample
from rlsdk.trainer_api import free_port
from rlsdk.engines.launch.sglang import SGLangLauncher, plan_launch
from rlsdk.engines.sglang_client import SGLangClient


def hand_started(opts: argparse.Namespace, port: int, log: Path) -> subprocess.Popen[bytes]:
    """SGLang as benchmarks/gpu/device.sh starts it."""
    command = [
        opts.sglang_python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(opts.model_config),
        "--load-format",
        "dummy",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--tp",
        "1",
        "--mem-fraction-static",
        str(opts.mem_fraction),
    ]
    return subprocess.Popen(
        command, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True, cwd="/tmp"
    )


async def wait_health(url: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"hand-started SGLang exited with {process.returncode}")
            try:
                async with session.get(
                    f"{url}/health_generate", timeout=aiohttp.ClientTimeout(total=30)
                ) as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.5)
    raise TimeoutError(f"hand-started SGLang not ready after {timeout}s")


def measure(
    url: str, prompts: list[list[int]], opts: argparse.Namespace, servers: list[str] | None = None
) -> dict[str, Any]:
    """Best of ``opts.repeat`` passes, each after the prefix cache of every server (default ``url``) was
    flushed, with every pass's tokens/s and their median."""
    warm = argparse.Namespace(**{**vars(opts), "new_tokens": 8})
    asyncio.run(straight(url, prompts[: opts.in_flight], warm, logprob=True))
    result = None
    passes = []
    for _ in range(opts.repeat):
        for server in servers or [url]:
            asyncio.run(flush(server))
        one = asyncio.run(straight(url, prompts, opts, logprob=True))
        passes.append(one.get("tokens_per_s"))
        result = best(result, one)
    assert result is not None
    measured = [p for p in passes if p is not None]
    median = round(statistics.median(measured), 1) if measured else None
    return {**result, "tokens_per_s_passes": passes, "tokens_per_s_median": median}


def throughput(opts: argparse.Namespace) -> dict[str, Any]:
    import signal

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(opts.model_config)
    prompts = make_prompts(tokenizer, opts.requests, opts.prompt_len)
    work = Path(tempfile.mkdtemp(prefix="gpu-loop-"))
    port = free_port()
    started = time.perf_counter()
    process = hand_started(opts, port, work / "hand.log")
    try:
        asyncio.run(wait_health(f"http://127.0.0.1:{port}", process, opts.startup_timeout))
        hand_startup = time.perf_counter() - started
        hand = measure(f"http://127.0.0.1:{port}", prompts, opts)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)
    time.sleep(5)  # let the card's memory go

    args = RolloutConfig(
        sglang_python=opts.sglang_python,
        sglang_mem_fraction_static=opts.mem_fraction,
        sglang_startup_timeout=opts.startup_timeout,
        extra={"sglang_load_format": "dummy"},
    )
    launcher = SGLangLauncher(plan_launch(args, str(opts.model_config)), work / "logs", opts.startup_timeout)
    started = time.perf_counter()
    asyncio.run(launcher.start())
    try:
        launched_startup = time.perf_counter() - started
        launched = measure(launcher.url, prompts, opts)
        dataset = write_dataset(tokenizer, prompts, work / "prompts.jsonl")
        asyncio.run(flush(launcher.url))
        opts.rm = "math"
        rollout = through_rlsdk(launcher.url, dataset, work, opts)
    finally:
        launcher.stop()
    return {
        "check": "launched_vs_hand_throughput",
        "hand": {**hand, "startup_seconds": round(hand_startup, 1)},
        "launched": {
            **launched,
            "startup_seconds": round(launched_startup, 1),
            "command": " ".join(launcher.plan.engines[0].command),
        },
        "rlsdk_run_through_launched": rollout,
        "ratio": round(launched["tokens_per_s"] / hand["tokens_per_s"], 3),
        "rlsdk_run_ratio": round(rollout["tokens_per_s"] / hand["tokens_per_s"], 3),
    }


def launched_throughput(
    opts: argparse.Namespace, gpus: int, work: Path, prompts: list[list[int]], policy: str | None = None
) -> dict[str, Any]:
    """The workload through ``gpus`` launched one-GPU engines (the router in front of more than one, with
    ``policy`` if given), its requests and concurrency ``gpus`` times one engine's."""
    args = RolloutConfig(
        sglang_python=opts.sglang_python,
        sglang_mem_fraction_static=opts.mem_fraction,
        sglang_startup_timeout=opts.startup_timeout,
        rollout_num_gpus=gpus,
        extra={"sglang_load_format": "dummy", **({"router_policy": policy} if policy else {})},
    )
    launcher = SGLangLauncher(
        plan_launch(args, str(opts.model_config)), work / f"logs-{gpus}-{policy}", opts.startup_timeout
    )
    started = time.perf_counter()
    asyncio.run(launcher.start())
    try:
        startup = time.perf_counter() - started
        scaled = argparse.Namespace(**{**vars(opts), "in_flight": opts.in_flight * gpus})
        servers = [f"http://{launcher.plan.host}:{e.port}" for e in launcher.plan.engines]
        result = measure(launcher.url, prompts[: opts.requests * gpus], scaled, servers)
    finally:
        launcher.stop()
    time.sleep(5)  # let the cards' memory go
    router = launcher.plan.router_command
    return {
        **result,
        "startup_seconds": round(startup, 1),
        "router": " ".join(router) if router else None,
    }


def engines2(opts: argparse.Namespace) -> dict[str, Any]:
    """One launched engine, then ``opts.engines`` behind the router (the launcher's policy, then each of
    ``opts.router_policies``): ``ratio`` of the best passes' tokens/s, ``median_ratio`` of the medians."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(opts.model_config)
    prompts = make_prompts(tokenizer, opts.engines * opts.requests, opts.prompt_len)
    work = Path(tempfile.mkdtemp(prefix="gpu-loop-"))
    one = launched_throughput(opts, 1, work, prompts)
    runs = {
        policy: attempt(launched_throughput, opts, opts.engines, work, prompts, policy)
        for policy in [None, *opts.router_policies]
    }
    many = runs.pop(None)

    def ratio(run: dict[str, Any], key: str = "tokens_per_s") -> float | None:
        return round(run[key] / one[key], 3) if run.get(key) and one.get(key) else None

    return {
        "check": "engines_behind_the_router",
        "engines": opts.engines,
        "one_engine": one,
        "many_engines": many,
        "ratio": ratio(many),
        "median_ratio": ratio(many, "tokens_per_s_median"),
        "many_engines_by_policy": runs,
        "ratios": {p: ratio(r) for p, r in runs.items() if "tokens_per_s" in r},
    }


def attempt(measure: Any, *args: Any) -> dict[str, Any]:
    """``measure(*args)``, or the error it raised (the next configuration is still measured)."""
    try:
        return measure(*args)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


async def generate_samples(
    client: SGLangClient, tokenizer: Any, count: int, new_tokens: int
) -> list[list[Sample]]:
    """Groups of 4 samples from SGLang (prompt of 64 words, ``new_tokens`` sampled with log-probs), random
    +-1 rewards so the advantages are not zero."""
    prompts = make_prompts(tokenizer, count // 4, 64)
    return await sample_groups(client, prompts, 4, new_tokens, ignore_eos=True)


def train_and_sync(opts: argparse.Namespace, weight_sync: str) -> dict[str, Any]:
    """The ``colocate`` and ``nccl`` checks: launch, generate, then steps of release/train/sync/check."""
    import torch

    from rlsdk.runtime import BackgroundLoop
    from rlsdk.training.sync import DiskSync, check_tolerance, choose_sync, engine_log_probs
    from rlsdk.training.torch_trainer import TorchTrainer

    colocate = weight_sync == "tensor"
    work = Path(tempfile.mkdtemp(prefix="gpu-loop-"))
    folder = random_checkpoint(opts.model_config, work / "weights", device="cuda")
    torch.cuda.empty_cache()
    args, client, command = launched_engine(opts, folder, work, colocate, weight_sync)
    loop = BackgroundLoop()
    started = time.perf_counter()
    loop.run(client.start())
    report: dict[str, Any] = {
        "check": f"{weight_sync}_sync",
        "engine": opts.engine,
        "startup_seconds": round(time.perf_counter() - started, 1),
        "command": command,
    }
    try:
        trainer = TorchTrainer(args)
        groups = loop.run(generate_samples(client, trainer.tokenizer, opts.samples, opts.new_tokens))
        probe = groups[0][0]
        strategy = choose_sync(args, client, work / "disk-sync")

        def gap(served: list[float], trained: list[float]) -> float:
            return max(abs(a - b) for a, b in zip(served, trained, strict=True))

        def diff() -> float:
            return gap(loop.run(engine_log_probs(client, probe)), trainer.response_log_probs([probe])[0])

        report["logprob_diff_before_training"] = round(diff(), 5)
        steps = []
        for step in range(opts.steps):
            served_before = loop.run(engine_log_probs(client, probe))
            t0 = time.perf_counter()
            loop.run(strategy.before_train(client))
            t1 = time.perf_counter()
            metrics = trainer.train_step(step, groups)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            stale = gap(
                served_before, trainer.response_log_probs([probe])[0]
            )  # what an unsynced engine serves
            t3 = time.perf_counter()
            loop.run(strategy.push(client, trainer, str(step + 1)))
            t4 = time.perf_counter()
            after = diff()
            t5 = time.perf_counter()
            steps.append(
                {
                    "release_seconds": round(t1 - t0, 4),
                    "train_seconds": round(t2 - t1, 3),
                    "sync_seconds": round(t4 - t3, 4),
                    **{k: round(v, 4) for k, v in strategy.timings.items()},
                    "trust_check_seconds": round(t5 - t4, 4),
                    "logprob_diff_after_sync": round(after, 5),
                    "logprob_diff_stale": round(stale, 5),
                    "train_tokens_per_s": round(metrics["train/tokens_per_s"], 1),
                    "loss": round(metrics["train/loss"], 5),
                }
            )
        report["steps"] = steps
        report["weights_check"] = weights_check(loop, client, trainer, opts.steps)
        syncs = [s["sync_seconds"] for s in steps[1:]] or [steps[0]["sync_seconds"]]  # the first warms up
        report["sync_seconds_median"] = statistics.median(syncs)
        tolerance = check_tolerance(args, trainer)
        report["trust_check_pass"] = all(s["logprob_diff_after_sync"] <= tolerance for s in steps)
        report["sync_check_tol"] = tolerance
        report["weight_version"] = loop.run(client.model_info())["weight_version"]
        if colocate and opts.engine == "sglang":
            report["sglang_serializer"] = sglang_serializer_sync(loop, client, trainer, strategy, diff)
        t0 = time.perf_counter()
        loop.run(DiskSync(work / "disk-sync").push(client, trainer, "disk"))
        report["disk_sync_seconds"] = round(time.perf_counter() - t0, 3)
        report["logprob_diff_after_disk_sync"] = round(diff(), 5)
    finally:
        loop.run(client.close())
    report["machine"] = machine()
    return report


def launched_engine(
    opts: argparse.Namespace, folder: Path, work: Path, colocate: bool, weight_sync: str
) -> tuple[RolloutConfig, Any, str]:
    """The run's options, the engine rlsdk launches for them (``--engine``: SGLang through its launcher, vLLM
    through the vllm engine plugin) and its command line."""
    common = {
        "hf_checkpoint": str(folder),
        "train": True,
        "colocate": colocate,
        "weight_sync": weight_sync,
        "lr": opts.lr,
        "micro_batch_size": 8,
        "rollout_temperature": 1.0,
        "train_device": "cuda",
        "output_dir": str(work),
    }
    if opts.engine == "vllm":
        from rlsdk_engine_vllm.plugin import vllm_engine

        args = RolloutConfig(
            **common,
            engine="vllm",
            vllm_python=opts.vllm_python,
            vllm_args=f"--dtype bfloat16 --gpu-memory-utilization {opts.mem_fraction}",
            vllm_startup_timeout=opts.startup_timeout,
        )
        client = vllm_engine(args)
        return args, client, " ".join(client.launcher.plan.command)
    args = RolloutConfig(
        **common,
        sglang_python=opts.sglang_python,
        sglang_mem_fraction_static=opts.mem_fraction,
        sglang_startup_timeout=opts.startup_timeout,
    )
    launcher = SGLangLauncher(plan_launch(args, str(folder)), work / "logs", opts.startup_timeout)
    return args, SGLangClient(launcher.url, launcher=launcher), " ".join(launcher.plan.engines[0].command)


def weights_check(loop: Any, client: Any, trainer: Any, version: int) -> dict[str, Any]:
    """The weights check after the last sync: every tensor the engine holds against the trainer's, by
    checksum (SGLang's /weights_checker; vLLM's through rlsdk's worker extension)."""
    from rlsdk.training.sync import WeightSyncError
    from rlsdk.training.trust import check_weights

    started = time.perf_counter()
    try:
        verdict = loop.run(check_weights(client, trainer, version))
    except WeightSyncError as exc:
        return {"ok": False, "error": str(exc)[:500]}
    return {
        "ok": verdict.complete,
        "tensors": verdict.tensors,
        "unverified": verdict.unverified[:10],
        "unavailable": verdict.unavailable,
        "seconds": round(time.perf_counter() - started, 3),
    }


def sglang_serializer_sync(loop: Any, client: Any, trainer: Any, strategy: Any, diff: Any) -> dict[str, Any]:
    """One more colocated sync with sglang importable in this process (its serializer and metadata classes,
    device by UUID). The image's packages stay first on the path; SGLang's own folder is appended."""
    site = os.environ.get("SGLANG_SITE", "/tmp/site")
    sys.path.extend([site, f"{site}/nvidia_cutlass_dsl/dsl_packages"])
    try:
        from sglang.srt.utils.common import MultiprocessingSerializer  # noqa: F401
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata  # noqa: F401
    except Exception as exc:  # noqa: BLE001 (any import failure: report it, keep the other results)
        return {"skipped": f"{type(exc).__name__}: {exc}"[:300]}
    times = []
    for version in ("sglang-1", "sglang-2"):
        loop.run(strategy.before_train(client))
        t0 = time.perf_counter()
        loop.run(strategy.push(client, trainer, version))
        times.append(round(time.perf_counter() - t0, 4))
    return {"sync_seconds": times, "logprob_diff_after_sync": round(diff(), 5)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("check", choices=["throughput", "colocate", "nccl", "engines2"])
    parser.add_argument("--model-config", default=".gpu/bench-model")
    parser.add_argument(
        "--engine",
        choices=["sglang", "vllm"],
        default="sglang",
        help="colocate/nccl: the engine rlsdk launches (vllm: the rlsdk-engine-vllm plugin)",
    )
    parser.add_argument(
        "--sglang-python",
        default="/tmp/sglang-python",
        help="An interpreter that imports sglang (device.sh setup writes this wrapper).",
    )
    parser.add_argument(
        "--vllm-python",
        default="/tmp/vllm-python",
        help="An interpreter that imports vllm 0.26 (device.sh setup_vllm writes this wrapper).",
    )
    parser.add_argument(
        "--mem-fraction",
        type=float,
        default=None,
        help="SGLang's --mem-fraction-static (default 0.7; 0.5 with colocate)",
    )
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    add_workload_options(parser, repeat_help="passes per configuration")
    parser.add_argument("--engines", type=int, default=2, help="engines2: engines behind the router")
    parser.add_argument(
        "--router-policies",
        nargs="*",
        default=[],
        help="engines2: more router policies to measure two engines with",
    )
    parser.add_argument("--samples", type=int, default=32, help="colocate/nccl: samples per train step")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-5)
    opts = parser.parse_args()
    opts.model_config = Path(opts.model_config).resolve()
    if opts.mem_fraction is None:
        opts.mem_fraction = 0.5 if opts.check == "colocate" else 0.7
    if opts.check in ("throughput", "engines2"):
        check = throughput if opts.check == "throughput" else engines2
        report = {"benchmark": "gpu_loop", **check(opts), "machine": machine()}
    else:
        opts.new_tokens = min(opts.new_tokens, 128)
        report = {
            "benchmark": "gpu_loop",
            **train_and_sync(opts, "tensor" if opts.check == "colocate" else "nccl"),
        }
    report["inputs"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(opts).items()}
    print(json.dumps(report))


if __name__ == "__main__":
    run_reporting(main, "gpu_loop")
