"""Tokens/s of vLLM 0.26 against SGLang 0.5.17 on the same card in the same call, on the same workload (not
run in CI; one device call of under 10 minutes; the last line printed is one JSON object).

The shared workload of ``sglang_throughput.py``: ``--requests`` prompts of ``--prompt-len`` random word tokens
of the bench model (random weights: ``--load-format dummy``, so responses run to their length),
``--new-tokens`` new tokens each with ``ignore_eos``, temperature 1, ``--in-flight`` requests at once,
the sampled tokens' log-probs asked for (as RL needs them). One server at a time, each given
``--mem-fraction`` of the GPU:

1. SGLang started by hand as ``device.sh server`` starts it; the straight client (``/generate``), with and
   without log-probs.
2. vLLM started by rlsdk's vllm engine (``--vllm-python``; its private socket, ``--load-format dummy``):
   the straight client on ``/v1/completions`` (prompt token ids, ``logprobs: 0``, ``return_token_ids``),
   with and without log-probs, and rlsdk's own client (:class:`rlsdk_engine_vllm.client.VLLMClient`: the
   same requests as SGLang's ``/generate`` bodies, translated), which is what a run uses.

Each figure is the best of ``--repeat`` passes, the prefix cache dropped before each. Reported:
``ratio`` = vLLM's straight tokens/s over SGLang's, both with log-probs (reported, not targeted), and
``client_ratio`` = rlsdk's vLLM client over vLLM's straight client (the translation's cost), with each
server's start-up seconds and command.

    PYTHONPATH=/tmp/rl:benchmarks/gpu python3 benchmarks/gpu/vllm_throughput.py --model-config .gpu/bench-model \\
        --sglang-python /tmp/sglang-python --vllm-python /tmp/vllm-python
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from gpu_loop import hand_started, wait_health
from sglang_throughput import best, flush, straight
from workload import add_workload_options, machine, make_prompts, run_reporting, started_vllm

from rlsdk import RolloutConfig, free_port


async def straight_vllm(socket: str, key: str, prompts: list[list[int]], opts: argparse.Namespace, logprob: bool) -> dict[str, Any]:
    """The minimal client of vLLM's completions API: ``--in-flight`` concurrent POSTs, one prompt each."""
    import aiohttp

    slots = asyncio.Semaphore(opts.in_flight)
    connector = aiohttp.UnixConnector(path=socket, limit=opts.in_flight)
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None), headers=headers) as session:

        async def one(ids: list[int]) -> int:
            body = {"prompt": ids, "max_tokens": opts.new_tokens, "temperature": opts.temperature,
                    "ignore_eos": True, "return_token_ids": True, **({"logprobs": 0} if logprob else {})}
            async with slots, session.post("http://localhost/v1/completions", json=body) as response:
                response.raise_for_status()
                answer = await response.json()
            made = int(answer["usage"]["completion_tokens"])
            if logprob:  # the log-probs were made, one per token
                assert len(answer["choices"][0]["logprobs"]["token_logprobs"]) == made, answer["choices"][0]
            return made

        started = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(p) for p in prompts)))
        seconds = time.perf_counter() - started
    return {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1)}


async def through_client(client: Any, prompts: list[list[int]], opts: argparse.Namespace) -> dict[str, Any]:
    """rlsdk's vLLM client, sent SGLang's ``/generate`` bodies with log-probs, as a run's generators send them."""
    params = {"max_new_tokens": opts.new_tokens, "temperature": opts.temperature, "ignore_eos": True}
    started = time.perf_counter()
    answers = await asyncio.gather(
        *(client.generate({"input_ids": p, "sampling_params": params, "return_logprob": True}) for p in prompts)
    )
    seconds = time.perf_counter() - started
    tokens = sum(a["meta_info"]["completion_tokens"] for a in answers)
    assert all(len(a["meta_info"]["output_token_logprobs"]) == len(a["output_ids"]) for a in answers)
    return {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1)}


def sglang_figures(opts: argparse.Namespace, prompts: list[list[int]], work: Path) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    process = hand_started(opts, port, work / "sglang.log")
    try:
        asyncio.run(wait_health(url, process, opts.startup_timeout))
        figures: dict[str, Any] = {"startup_seconds": round(time.perf_counter() - started, 1)}
        warm = argparse.Namespace(**{**vars(opts), "new_tokens": 8})
        asyncio.run(straight(url, prompts[: opts.in_flight], warm, logprob=True))
        for _ in range(opts.repeat):
            for name, logprob in (("straight_no_logprob", False), ("straight_logprob", True)):
                asyncio.run(flush(url))
                figures[name] = best(figures.get(name), asyncio.run(straight(url, prompts, opts, logprob)))
        return figures
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)


def vllm_figures(opts: argparse.Namespace, prompts: list[list[int]], work: Path) -> dict[str, Any]:
    from rlsdk.runtime import BackgroundLoop

    args = RolloutConfig(
        engine="vllm",
        hf_checkpoint=str(opts.model_config),
        vllm_python=opts.vllm_python,
        vllm_args=f"--load-format dummy --gpu-memory-utilization {opts.mem_fraction}",
        vllm_startup_timeout=opts.startup_timeout,
        vllm_server_concurrency=opts.in_flight,
        output_dir=str(work / "vllm"),
    )
    loop = BackgroundLoop()
    client, figures = started_vllm(args, loop)
    socket, key = client.launcher.socket, client.launcher.api_key
    try:
        warm = argparse.Namespace(**{**vars(opts), "new_tokens": 8})
        asyncio.run(straight_vllm(socket, key, prompts[: opts.in_flight], warm, logprob=True))
        for _ in range(opts.repeat):
            for name, measure in (
                ("straight_no_logprob", lambda: asyncio.run(straight_vllm(socket, key, prompts, opts, False))),
                ("straight_logprob", lambda: asyncio.run(straight_vllm(socket, key, prompts, opts, True))),
                ("rlsdk_client", lambda: loop.run(through_client(client, prompts, opts))),
            ):
                loop.run(client.flush_cache())
                figures[name] = best(figures.get(name), measure())
    finally:
        loop.run(client.close())
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-config", default=".gpu/bench-model")
    parser.add_argument("--sglang-python", default="/tmp/sglang-python")
    parser.add_argument("--vllm-python", default="/tmp/vllm-python")
    parser.add_argument("--mem-fraction", type=float, default=0.7, help="SGLang's --mem-fraction-static, vLLM's --gpu-memory-utilization")
    parser.add_argument("--startup-timeout", type=float, default=400.0)
    add_workload_options(parser)
    opts = parser.parse_args()
    opts.model_config = Path(opts.model_config).resolve()

    from transformers import AutoTokenizer

    prompts = make_prompts(AutoTokenizer.from_pretrained(opts.model_config), opts.requests, opts.prompt_len)
    work = Path(tempfile.mkdtemp(prefix="vllm-throughput-"))
    sglang = sglang_figures(opts, prompts, work)
    time.sleep(5)  # let the card's memory go
    vllm = vllm_figures(opts, prompts, work)
    report = {
        "benchmark": "vllm_throughput",
        "inputs": {k: str(v) if isinstance(v, Path) else v for k, v in vars(opts).items()},
        "sglang": sglang,
        "vllm": vllm,
        "ratio": round(vllm["straight_logprob"]["tokens_per_s"] / sglang["straight_logprob"]["tokens_per_s"], 3),
        "ratio_no_logprob": round(
            vllm["straight_no_logprob"]["tokens_per_s"] / sglang["straight_no_logprob"]["tokens_per_s"], 3
        ),
        "client_ratio": round(vllm["rlsdk_client"]["tokens_per_s"] / vllm["straight_logprob"]["tokens_per_s"], 3),
        # every pass made every token it asked for (ignore_eos), so each figure counts the same work
        "every_token_made": all(
            figure["tokens"] == opts.requests * opts.new_tokens
            for server in (sglang, vllm)
            for figure in server.values()
            if isinstance(figure, dict)
        ),
        "machine": machine(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    run_reporting(main, "vllm_throughput")
