"""Tokens/s of a real SGLang server, sent the shared workload straight by a minimal client and through
``rlsdk run``'s rollout loop, in the same session on the same card (not run in CI).

The workload (the shared measurement's): ``--requests`` prompts of ``--prompt-len`` random word
tokens, ``--new-tokens`` new tokens each with ``ignore_eos``, ``--in-flight`` requests at once,
temperature 1. The straight client posts the ``/generate`` bodies itself over one aiohttp session,
once without log-probs and once with ``return_logprob`` (the baseline, since RL needs log-probs).
``rlsdk run --engine URL`` gets the same prompts as a JSONL of their text, one sample per prompt,
``--sglang-server-concurrency`` = ``--in-flight``, the ``math`` reward (by default) and a generator that
forwards to rlsdk's single-turn generate with ``ignore_eos`` added (``workload.to_length``); its figure is
the step's ``rollout/tokens_per_s`` (tokens over the whole step: generation, rewards, bookkeeping).
The prefix cache is flushed before each timed pass. Each figure is the best of ``--repeat`` passes.

The last line is one JSON object; ``ratio`` = rlsdk's tokens/s over the straight client's with
log-probs (>1 better; target at least 0.95), ``ratio_vs_no_logprob`` against the one without.

    python benchmarks/gpu/sglang_throughput.py --url http://127.0.0.1:30000 --model-config .gpu/bench-model
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from workload import add_workload_options, machine, make_prompts, write_dataset

HERE = Path(__file__).resolve().parent


async def straight(url: str, prompts: list[list[int]], opts: argparse.Namespace, logprob: bool) -> dict[str, Any]:
    """The minimal client: ``--in-flight`` concurrent POSTs to ``/generate``, one body per prompt."""
    import aiohttp

    params = {"max_new_tokens": opts.new_tokens, "temperature": opts.temperature, "ignore_eos": True}
    slots = asyncio.Semaphore(opts.in_flight)
    connector = aiohttp.TCPConnector(limit=opts.in_flight)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async def one(ids: list[int]) -> int:
            body = {"input_ids": ids, "sampling_params": params, "return_logprob": logprob}
            async with slots, session.post(f"{url}/generate", json=body) as response:
                response.raise_for_status()
                return (await response.json())["meta_info"]["completion_tokens"]

        started = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(p) for p in prompts)))
        seconds = time.perf_counter() - started
    return {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1)}


def through_rlsdk(url: str, dataset: Path, work: Path, opts: argparse.Namespace) -> dict[str, Any]:
    """``rlsdk run --engine URL`` over the prompts' text: one step of ``--requests`` samples."""
    out = work / "run"
    cmd = [sys.executable, "-m", "rlsdk_cli.app", "run", "--engine", url, "--hf-checkpoint", str(opts.model_config),
           "--data", str(dataset), "--label-key", "label", "--no-chat-template", "--rm", opts.rm,
           "--custom-generate", "workload:to_length", "--num-rollout", "1",
           "--rollout-batch-size", str(opts.requests), "--n-samples-per-prompt", "1",
           "--max-new-tokens", str(opts.new_tokens), "--temperature", str(opts.temperature),
           "--sglang-server-concurrency", str(opts.in_flight), "--output", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"rlsdk run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    step = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    return {"tokens": step["rollout/tokens"], "seconds": round(step["rollout/seconds"], 3),
            "tokens_per_s": round(step["rollout/tokens_per_s"], 1), "kept": step["ledger/kept"],
            "failed": step["ledger/failed"], "process_seconds": round(wall, 1), "command": " ".join(cmd[1:])}


async def flush(url: str) -> None:
    """Drop SGLang's prefix cache so no pass reuses an earlier pass's prompts."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        for _ in range(100):
            async with session.get(f"{url}/flush_cache") as response:
                if response.status == 200:
                    return
            await asyncio.sleep(0.1)


def best(current: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    if current is None:
        return {**new, "all_tokens_per_s": [new["tokens_per_s"]]}
    runs = [*current["all_tokens_per_s"], new["tokens_per_s"]]
    chosen = new if new["tokens_per_s"] > current["tokens_per_s"] else current
    return {**chosen, "all_tokens_per_s": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--model-config", default=".gpu/bench-model", help="The served model's tokenizer folder.")
    add_workload_options(parser)
    parser.add_argument("--rm", default="math")
    opts = parser.parse_args()
    opts.model_config = Path(opts.model_config).resolve()

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(opts.model_config)
    prompts = make_prompts(tokenizer, opts.requests, opts.prompt_len)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sglang-throughput-") as tmp:
        work = Path(tmp)
        dataset = write_dataset(tokenizer, prompts, work / "prompts.jsonl")
        warm = argparse.Namespace(**{**vars(opts), "new_tokens": 8})
        asyncio.run(straight(opts.url, prompts[: opts.in_flight], warm, logprob=True))  # warm-up
        for _ in range(opts.repeat):  # interleaved, so drift on the card affects all alike
            for name, measure in (
                ("straight_no_logprob", lambda: asyncio.run(straight(opts.url, prompts, opts, logprob=False))),
                ("straight_logprob", lambda: asyncio.run(straight(opts.url, prompts, opts, logprob=True))),
                ("rlsdk", lambda: through_rlsdk(opts.url, dataset, work, opts)),
            ):
                asyncio.run(flush(opts.url))
                results[name] = best(results.get(name), measure())
    baseline = results["straight_logprob"]["tokens_per_s"]
    report = {
        "benchmark": "sglang_throughput",
        "inputs": {"url": opts.url, "model_config": str(opts.model_config), "weights": "random (--load-format dummy)",
                   "requests": opts.requests, "prompt_len": opts.prompt_len, "new_tokens": opts.new_tokens,
                   "in_flight": opts.in_flight, "temperature": opts.temperature, "ignore_eos": True,
                   "reward": opts.rm, "repeat": opts.repeat},
        **results,
        "machine": machine(),
        "ratio": round(results["rlsdk"]["tokens_per_s"] / baseline, 3),
        "ratio_vs_no_logprob": round(results["rlsdk"]["tokens_per_s"] / results["straight_no_logprob"]["tokens_per_s"], 3),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
