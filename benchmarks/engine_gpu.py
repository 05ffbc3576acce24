"""Tokens/s of the embedded engine on a GPU: alone, through the SGLang client over HTTP, and through
``rlsdk run`` (not run in CI: it needs a CUDA card).

The model is a 0.5B-class configuration (default: the shared bench model, a 0.48B Llama with
SmolLM2's tokenizer) with random weights, so nothing is downloaded and sampled outputs run to their
length limit. Every path gets the same prompts (``--requests`` prompts of ``--prompt-len`` tokens)
and the same sampling parameters (those ``rlsdk run`` derives from its options, log-probs included,
plus ``ignore_eos``, which the run gets from ``--custom-generate workload:to_length``: a row that
stopped early would change the batch's shape mid-pass and the figures with it),
at the same batch (``--batch`` rows decoded together).

The same code's throughput differs by up to a fifth between two processes on one card, so one process
per path cannot tell a gap from that spread. Each of ``--rounds`` rounds runs both paths, each in a
fresh process, one after the other (the engine alone first in odd rounds, ``rlsdk run`` first in even
ones: keep ``--rounds`` even, so that each path goes first as often, since the second process of a
round ran its steps slower in all seven rounds of one H100 run); the ratio is taken within each round
and its median reported. A path's figure in a process is
its best pass after a full warm-up pass (the first pass over new sequence lengths runs at a third of
the speed in a fresh process: kernel choices and cache blocks for every length).

- ``engine``: ``EmbeddedEngine.generate`` called directly, all requests at once (the baseline), a
  warm-up pass then ``--repeat`` timed passes;
- ``http``: the same engine behind ``rlsdk.run.engine_server`` on loopback, reached by ``SGLangClient``;
- ``rlsdk_run``: ``rlsdk run --engine embedded`` over a JSONL of the prompts' text, ``--steps`` steps of
  ``--requests`` samples; its figure is the best step's ``rollout/tokens_per_s`` (step tokens over step
  seconds: generation, rewards and bookkeeping; the first step also warms the engine up).

Each figure comes with the engine's ``busy_share`` (time in steps over wall time) and ``ms_per_step``,
which tell slower steps (contention inside the forward pass) from time lost between steps, and with
the engine thread's ``engine_cpu_share`` (its CPU time over its step time), ``switches_per_step`` and
``forced_switches_per_step`` (it waited, for the GIL or the GPU; it was preempted), the process's
``gc_share`` and ``other_threads_cpu_share``, and the machine's ``machine_busy_cores``. The engine
process's ``warm_up`` pass is reported too: what a pass over new lengths costs.

The last line printed is one JSON object: inputs, every process's figures, each path's median, the
machine and card, and ``ratio``: the median over rounds of rlsdk run's tokens/s over the engine's alone
(>1 better; target at least 0.95). ``ratio_busy`` is the same median for busy shares: what the run
loses between engine steps, whatever the speed of the steps in each process.

    python benchmarks/engine_gpu.py --model-config PATH/bench-model [--requests 256 --batch 256 --rounds 8]
    python benchmarks/engine_gpu.py --device cpu --dtype float32 --tiny   # a quick check without a GPU
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

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
from workload import (  # noqa: E402
    COUNTERS,
    ENGINE_TRACE,
    TINY,
    engine_counters,
    engine_share,
    machine,
    make_prompts,
    random_checkpoint,
    write_dataset,
)


def run_settings(opts: argparse.Namespace) -> dict[str, Any]:
    """The options ``rlsdk run`` gets; the engine and HTTP paths use the sampling parameters they imply."""
    return {"rollout_batch_size": opts.requests, "n_samples_per_prompt": 1,
            "rollout_max_response_len": opts.new_tokens, "rollout_temperature": opts.temperature,
            "rollout_top_p": 1.0, "rollout_top_k": -1, "sglang_server_concurrency": max(512, opts.requests)}


def payloads(prompts: list[list[int]], sampling_params: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"input_ids": ids, "sampling_params": dict(sampling_params), "return_logprob": True} for ids in prompts]


async def timed_requests(send: Any, requests: list[dict[str, Any]], stats: Any) -> dict[str, Any]:
    """Send every request at once through ``send``; tokens generated over wall seconds, and the engine's
    share of that time (``stats``: the engine's counters)."""
    before = engine_counters(stats)
    started = time.perf_counter()
    responses = await asyncio.gather(*(send(r) for r in requests))
    seconds = time.perf_counter() - started
    tokens = sum(r["meta_info"]["completion_tokens"] for r in responses)
    assert all(len(r["meta_info"]["output_token_logprobs"]) == r["meta_info"]["completion_tokens"] for r in responses)
    return {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1),
            **engine_share(before, engine_counters(stats))}


async def engine_and_http(folder: Path, prompts: list[list[int]], opts: argparse.Namespace) -> dict[str, Any]:
    """The engine alone, then behind ``rlsdk.run.engine_server`` through ``SGLangClient``; one engine, warmed up
    first."""
    from rlsdk import RolloutConfig
    from rlsdk.engines.sglang_client import SGLangClient
    from rlsdk.run.engine_server import start_server
    from rlsdk.rollout.generate import sampling_params_for
    from rlsdk.runtime import tuned_garbage_collector
    from rlsdk_embedded import EmbeddedEngine

    params = {**sampling_params_for(RolloutConfig.from_dict(run_settings(opts))), "ignore_eos": True}
    requests = payloads(prompts, params)
    engine = EmbeddedEngine(folder, device=opts.device, dtype=opts.dtype, max_batch_size=opts.batch)
    await engine.start()
    try:
        with tuned_garbage_collector():  # as rlsdk run does: the same garbage collector costs on both paths
            # warm-up: kernels and cache blocks for every length (its figure tells what a first pass costs)
            results: dict[str, Any] = {"warm_up": await timed_requests(engine.generate, requests, engine.stats)}
            for _ in range(opts.repeat):
                engine_run = await timed_requests(engine.generate, requests, engine.stats)
                results["engine"] = best(results.get("engine"), engine_run)
            server = await start_server(engine, "127.0.0.1", 0)
            client = SGLangClient(server.url, concurrency=max(512, opts.requests))
            try:
                for _ in range(opts.repeat):
                    http_run = await timed_requests(client.generate, requests, engine.stats)
                    results["http"] = best(results.get("http"), http_run)
            finally:
                await client.close()
                await server.close()
            return {"sampling_params": params, **results, "engine_stats": vars(engine.stats)}
    finally:
        await engine.close()


def best(current: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """The faster pass, with every pass's tokens/s in ``all_tokens_per_s``."""
    runs = [*(current or {}).get("all_tokens_per_s", []), new["tokens_per_s"]]
    chosen = new if current is None or new["tokens_per_s"] > current["tokens_per_s"] else current
    return {**chosen, "all_tokens_per_s": runs}


def engine_alone(work: Path, opts: argparse.Namespace) -> dict[str, Any]:
    """The engine and HTTP paths in a fresh process (this script with ``--child``)."""
    cmd = [sys.executable, __file__, "--child", "--work", str(work),
           "--device", opts.device, "--dtype", opts.dtype, "--requests", str(opts.requests),
           "--new-tokens", str(opts.new_tokens), "--batch", str(opts.batch), "--temperature",
           str(opts.temperature), "--repeat", str(opts.repeat)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the engine process failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def through_rlsdk_run(work: Path, out: Path, opts: argparse.Namespace) -> dict[str, Any]:
    """``rlsdk run`` in a fresh process over the prompts' text; the best step's tokens/s."""
    settings = run_settings(opts)
    cmd = [sys.executable, "-m", "rlsdk_cli.app", "run", "--engine", "embedded", "--model", str(work / "model"),
           "--data", str(work / "prompts.jsonl"), "--label-key", "label", "--no-chat-template", "--rm", opts.rm,
           "--custom-generate", "workload:to_length", "--num-rollout", str(opts.steps),
           "--rollout-batch-size", str(settings["rollout_batch_size"]),
           "--n-samples-per-prompt", "1", "--max-new-tokens", str(opts.new_tokens),
           "--temperature", str(opts.temperature), "--top-p", "1.0", "--top-k", "-1",
           "--sglang-server-concurrency", str(settings["sglang_server_concurrency"]), "--output", str(out),
           "--set", f"engine_device={opts.device}", "--set", f"engine_dtype={opts.dtype}",
           "--set", f"engine_max_batch_size={opts.batch}"]
    here = str(Path(__file__).resolve().parent / "gpu")
    trace = out.parent / f"{out.name}-engine.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])),
           ENGINE_TRACE: str(trace)}
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"rlsdk run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    calls = [json.loads(line) for line in trace.read_text().splitlines()]
    figures = []
    for n, step in enumerate(steps):  # every step's samples finish before the next step starts
        chunk = calls[n * opts.requests:(n + 1) * opts.requests]
        first = {k: min(c["before"][k] for c in chunk) for k in COUNTERS}
        last = {**chunk[-1]["after"], **{k: max(c["after"][k] for c in chunk) for k in COUNTERS}}
        figures.append({"tokens": step["rollout/tokens"], "seconds": round(step["rollout/seconds"], 3),
                        "tokens_per_s": round(step["rollout/tokens_per_s"], 1), **engine_share(first, last)})
    chosen = max(figures, key=lambda f: f["tokens_per_s"])
    return {**chosen, "steps": figures, "process_seconds": round(wall, 1), "command": " ".join(cmd[1:])}


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each process's figure and the median of them."""
    figures = [r["tokens_per_s"] for r in runs]
    return {"tokens_per_s": round(statistics.median(figures), 1), "per_process": figures,
            "busy_share": [r["busy_share"] for r in runs], "ms_per_step": [r["ms_per_step"] for r in runs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-config", default=os.environ.get("BENCH_MODEL", ".gpu/bench-model"),
                        help="Folder with config.json and the tokenizer (weights are made up).")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--batch", type=int, default=256, help="Rows the engine decodes together.")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--rm", default="math", help="The reward of the rlsdk run path.")
    parser.add_argument("--steps", type=int, default=3, help="rlsdk run steps (the best one counts).")
    parser.add_argument("--repeat", type=int, default=2, help="Timed engine passes per process (best counts).")
    parser.add_argument("--rounds", type=int, default=8,
                        help="Rounds of one fresh process per path (even: each path first in half of them).")
    parser.add_argument("--tiny", action="store_true", help="Shrink the model (for checking on a CPU).")
    parser.add_argument("--skip-run", action="store_true", help="Leave out the rlsdk run path.")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:  # one engine process: the engine and HTTP figures as JSON
        work = Path(opts.work)
        prompts = json.loads((work / "prompts.json").read_text())
        print(json.dumps(asyncio.run(engine_and_http(work / "model", prompts, opts))))
        return

    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="engine-gpu-") as tmp:
        work = Path(tmp)
        folder = random_checkpoint(opts.model_config, work / "model", dtype=opts.dtype, device=opts.device,
                                   overrides=TINY if opts.tiny else None)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        prompts = make_prompts(tokenizer, opts.requests, opts.prompt_len)
        (work / "prompts.json").write_text(json.dumps(prompts))
        write_dataset(tokenizer, prompts, work / "prompts.jsonl")
        if opts.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()
        rounds: list[dict[str, Any]] = []
        for round_ in range(opts.rounds):
            figures: dict[str, Any] = {"first": "engine" if round_ % 2 == 0 else "rlsdk_run"}
            for path in ("engine", "rlsdk_run") if round_ % 2 == 0 else ("rlsdk_run", "engine"):
                if path == "engine":
                    figures.update(engine_alone(work, opts))
                elif not opts.skip_run:
                    figures["rlsdk_run"] = through_rlsdk_run(work, work / f"run-{round_}", opts)
            rounds.append(figures)
            print(f"round {round_ + 1}: " + ", ".join(f"{k} {figures[k]['tokens_per_s']}"
                                                   for k in ("engine", "rlsdk_run") if k in figures), file=sys.stderr)
    engine = median_of([r["engine"] for r in rounds])
    http = median_of([r["http"] for r in rounds])
    run = None if opts.skip_run else median_of([r["rlsdk_run"] for r in rounds])
    paired = [] if opts.skip_run else [
        round(r["rlsdk_run"]["tokens_per_s"] / r["engine"]["tokens_per_s"], 3) for r in rounds]
    report = {
        "benchmark": "engine_gpu",
        "inputs": {"model_config": str(opts.model_config), "tiny": opts.tiny, "weights": "random",
                   "device": opts.device, "dtype": opts.dtype, "requests": opts.requests,
                   "prompt_len": opts.prompt_len, "new_tokens": opts.new_tokens, "batch": opts.batch,
                   "reward": opts.rm, "rounds": opts.rounds, "repeat": opts.repeat, "steps": opts.steps,
                   "sampling_params": rounds[0]["sampling_params"]},
        "engine": engine,
        "http": http,
        "rlsdk_run": run,
        "ratios_per_round": paired,
        "rounds": rounds,
        "machine": machine(),
        # time between engine steps only, blind to how fast the steps themselves ran in each process
        "ratio_busy": None if opts.skip_run else round(statistics.median(
            r["rlsdk_run"]["busy_share"] / r["engine"]["busy_share"] for r in rounds), 3),
        "ratio_http": round(statistics.median(
            r["http"]["tokens_per_s"] / r["engine"]["tokens_per_s"] for r in rounds), 3),
        "ratio": round(statistics.median(paired), 3) if paired else None,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
