"""The main job against a real SGLang server (not run in CI: it needs the GPU machine's server).

1. ``rlsdk run --engine URL --hf-checkpoint MODEL`` over a few hundred arithmetic prompts with the
   ``math`` reward, without and with ``--partial-rollout``. Each run over-samples (twice the groups it
   keeps, a bounded number of requests in flight) and lets a set of stop token ids end responses at
   random lengths, so groups finish at different times and the end of each step aborts some mid-way.
   Checked: the run completes; every step's ledger balances (entered = kept + dropped + returned +
   failed) with nothing failed; steps abort requests; with partial rollouts, samples aborted at the
   end of a step come back next step with their earlier tokens and a second generate call (two weight
   versions), staying within the length limit; without, they start over.
2. ``SGLangClient`` in process: abort-all returns every request in flight with what it generated so
   far (tokens and log-probs aligned), ``wait_idle`` returns once the server is idle, abort by rid,
   ``flush_cache`` refused while busy, streaming, ``model_info``.

The last line is one JSON object: each check with ``ok`` and details, and ``ok`` for all of them.

    python benchmarks/gpu/sglang_checks.py --url http://127.0.0.1:30000 --model-config .gpu/bench-model
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from workload import machine

STOP_IDS = list(range(1000, 1800))
"""With random weights each is drawn about once per 49,152 tokens: 800 of them end a response after
about 60 tokens on average, so lengths vary as real ones do."""


def arithmetic_dataset(path: Path, rows: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(rows):
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            f.write(json.dumps({"input": f"What is {a} + {b}? Put your final answer in \\boxed{{}}.",
                                "label": str(a + b)}) + "\n")
    return path


def rlsdk_run_against(url: str, dataset: Path, out: Path, opts: argparse.Namespace, partial: bool) -> dict[str, Any]:
    """One ``rlsdk run`` against the server; the run's steps and samples, checked."""
    cmd = [sys.executable, "-m", "rlsdk_cli.app", "run", "--engine", url, "--hf-checkpoint", str(opts.model_config),
           "--data", str(dataset), "--label-key", "label", "--no-chat-template", "--rm", "math",
           "--num-rollout", str(opts.steps), "--rollout-batch-size", str(opts.groups),
           "--n-samples-per-prompt", str(opts.samples), "--over-sampling-batch-size", str(2 * opts.groups),
           "--max-new-tokens", str(opts.new_tokens), "--sglang-server-concurrency", str(opts.in_flight),
           "--output", str(out), "--set", f"rollout_stop_token_ids={json.dumps(STOP_IDS)}"]
    if partial:
        cmd.append("--partial-rollout")
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    result: dict[str, Any] = {"partial_rollout": partial, "returncode": proc.returncode,
                              "seconds": round(time.perf_counter() - started, 1)}
    if proc.returncode != 0:
        return {**result, "ok": False, "stderr": proc.stderr[-3000:]}
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    ledgers = [{k.removeprefix("ledger/"): s[k] for k in ("ledger/entered", "ledger/kept", "ledger/dropped",
                                                           "ledger/returned", "ledger/failed")} for s in steps]
    balanced = all(x["entered"] == x["kept"] + x["dropped"] + x["returned"] + x["failed"] for x in ledgers)
    resumed = [r for r in rows if "returned_at_rollout_id" in r["metadata"]]
    continued = [r for r in resumed if len(r["weight_versions"]) >= 2]
    within = all(r["response_length"] <= opts.new_tokens for r in rows)
    aligned = all(len(r["rollout_log_probs"] or []) == r["response_length"] for r in rows)
    result.update(
        steps=len(steps), ledgers=ledgers, aborted=[s.get("rollout/aborted", 0) for s in steps],
        resumed=[s.get("rollout/resumed", 0) for s in steps], samples_written=len(rows),
        resumed_samples=len(resumed), resumed_with_earlier_tokens=len(continued),
        reward_mean=[s.get("rollout/reward_mean") for s in steps],
        response_len_mean=[round(s.get("rollout/response_len_mean", 0), 1) for s in steps],
        tokens_per_s=[round(s.get("rollout/tokens_per_s", 0), 1) for s in steps],
    )
    checks = {
        "completed": len(steps) == opts.steps and len(rows) == opts.steps * opts.groups * opts.samples,
        "ledger_balances": balanced,
        "nothing_failed": all(x["failed"] == 0 for x in ledgers),
        "steps_aborted_requests": sum(result["aborted"][:-1]) > 0,
        "within_length_limit": within,
        "logprobs_aligned": aligned,
        # partial: aborted samples resume with their tokens; otherwise they start over
        "resume": (len(continued) > 0) if partial else (len(resumed) > 0 and not continued),
    }
    return {**result, "checks": checks, "ok": all(checks.values())}


async def client_checks(url: str, opts: argparse.Namespace) -> dict[str, Any]:
    """SGLangClient against the server: abort-all, wait_idle, abort by rid, flush, stream, model_info."""
    from rlsdk.engines.sglang_client import SGLangClient

    client = SGLangClient(url)
    params = {"max_new_tokens": 4000, "temperature": 1.0, "ignore_eos": True}
    body = {"input_ids": list(range(100, 228)), "sampling_params": params, "return_logprob": True}
    result: dict[str, Any] = {}
    try:
        info = await client.model_info()
        result["model_info"] = {k: info.get(k) for k in ("model_path", "weight_version")}

        # abort-all: every request in flight comes back with what it generated so far
        tasks = [asyncio.create_task(client.generate(dict(body))) for _ in range(opts.abort_requests)]
        load = await wait_for_load(client, lambda x: x["num_running_reqs"] >= 1)
        await asyncio.sleep(1.0)
        busy_flush = await client.flush_cache()
        aborted_at = time.perf_counter()
        await client.abort()
        responses = await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
        returned_in = time.perf_counter() - aborted_at
        await client.wait_idle(timeout=60)
        idle_in = time.perf_counter() - aborted_at
        after = await client.load()
        kinds = sorted({r["meta_info"]["finish_reason"]["type"] for r in responses})
        lengths = [r["meta_info"]["completion_tokens"] for r in responses]
        aligned = all(len(r["meta_info"]["output_token_logprobs"]) == len(r["output_ids"]) == n
                      for r, n in zip(responses, lengths))
        result["abort_all"] = {
            "requests": len(responses), "load_seen": load, "finish_types": kinds,
            "tokens_min": min(lengths), "tokens_max": max(lengths), "tokens_logprobs_aligned": aligned,
            "returned_seconds": round(returned_in, 3), "idle_seconds": round(idle_in, 3), "load_after": after,
            "flush_while_busy": busy_flush, "flush_when_idle": await client.flush_cache(),
            "ok": kinds == ["abort"] and min(lengths) > 0 and max(lengths) < 4000 and aligned
            and after == {"num_running_reqs": 0, "num_waiting_reqs": 0} and not busy_flush,
        }

        # abort one request by rid; another keeps running to its end
        one = asyncio.create_task(client.generate({**body, "rid": "rlsdk-check-abort"}))
        other = asyncio.create_task(client.generate({**body, "sampling_params": {**params, "max_new_tokens": 64}}))
        await wait_for_load(client, lambda x: x["num_running_reqs"] >= 1)
        await asyncio.sleep(0.5)
        await client.abort("rlsdk-check-abort")
        first, second = await asyncio.wait_for(asyncio.gather(one, other), timeout=60)
        result["abort_rid"] = {
            "aborted": first["meta_info"]["finish_reason"]["type"], "other": second["meta_info"]["finish_reason"],
            "ok": first["meta_info"]["finish_reason"]["type"] == "abort"
            and second["meta_info"]["finish_reason"]["type"] == "length",
        }

        # streaming: cumulative chunks, the last with its finish reason
        chunks = [c async for c in client.generate_stream({**body, "sampling_params": {**params, "max_new_tokens": 16}})]
        result["stream"] = {"chunks": len(chunks), "last_finish": chunks[-1]["meta_info"]["finish_reason"],
                            "ok": len(chunks) > 1 and chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"}
        await client.wait_idle(timeout=30)
        result["wait_idle"] = {"ok": True}
    finally:
        await client.close()
    result["ok"] = all(v.get("ok", True) for v in result.values() if isinstance(v, dict))
    return result


async def wait_for_load(client: Any, ready: Any, timeout: float = 60.0) -> dict[str, int]:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        load = await client.load()
        if ready(load):
            return load
        await asyncio.sleep(0.05)
    raise TimeoutError(f"the server never reported the requests running: {load}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--model-config", default=".gpu/bench-model", help="The served model's tokenizer folder.")
    parser.add_argument("--rows", type=int, default=320, help="Prompts in the dataset.")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--groups", type=int, default=32, help="Groups kept per step.")
    parser.add_argument("--samples", type=int, default=4, help="Samples per prompt.")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--abort-requests", type=int, default=64)
    opts = parser.parse_args()
    opts.model_config = Path(opts.model_config).resolve()

    report: dict[str, Any] = {"benchmark": "sglang_checks", "inputs": {**vars(opts), "model_config": str(opts.model_config),
                                                                       "stop_token_ids": len(STOP_IDS)}}
    with tempfile.TemporaryDirectory(prefix="sglang-checks-") as tmp:
        dataset = arithmetic_dataset(Path(tmp) / "arithmetic.jsonl", opts.rows)
        for partial in (False, True):
            name = "run_partial_rollout" if partial else "run"
            report[name] = rlsdk_run_against(opts.url, dataset, Path(tmp) / name, opts, partial)
    report["client"] = asyncio.run(client_checks(opts.url, opts))
    report["machine"] = machine()
    report["ok"] = all(report[k]["ok"] for k in ("run", "run_partial_rollout", "client"))
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
