"""What rlsdk's rollout loop costs per sample: throughput against an instant engine, and the overhead as a
share of step time when each request takes a fixed time.

Both sides run on one core, on the same instant engine (the benchmark's ``bench_instant`` engine plugin,
registered only here), the same prompts, the same trivial sync reward and the same dynamic filter
(filter_hub's ``check_reward_nonzero_std``, which drops every fourth group here):

- **rlsdk**: slime's ``generate_rollout`` entry point, i.e. :func:`rlsdk.rollout.step.rollout_step` with the
  data source, buffer (surplus groups), plugin calls, ledger and metrics;
- **baseline**: a minimal hand-written asyncio loop doing the same work (generate every sample of a
  chunk concurrently, call the reward, call the filter, keep groups until the batch is full, carry the
  surplus over) with no plugin machinery, ledger or buffer.

Both sides run under the garbage-collector settings of ``rlsdk run`` (``tuned_garbage_collector``: start-up
objects frozen, young collections every 20,000 allocations); with Python's defaults, as in a process that
slime drives, a full collection can land in a timed step.

``samples_per_s`` is rlsdk's best kept-samples-per-second over step sizes of 16 to 4,096 samples;
``ratio`` is that over the baseline's best (1.0: rlsdk's machinery costs nothing). The latency part runs
steps whose requests each take ``--latency`` seconds (one wave: every request in flight at once) and
reports the step time beyond that latency as a share of the step. Targets: 20,000 samples/s and an
overhead under 0.5% of step time.

    python benchmarks/loop_overhead.py [--sizes 16,64,256,1024,4096] [--latency 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import machine, pin_one_core, write_prompts

from rlsdk import DynamicFilterOutput, Engine, Reward, RolloutConfig, Sample, get_plugin_manager, hookimpl
from rlsdk.data import DataSource
from rlsdk.rollout.generate import sampling_params_for
from rlsdk.rollout.step import generate_rollout
from rlsdk.runtime import BackgroundLoop, Runtime, bind_runtime, tuned_garbage_collector
from rlsdk.testing import ByteTokenizer, FakeEngine, FakeReply

N_SAMPLES = 8
RESPONSE_TOKENS = 16
TARGET_SAMPLES_PER_S = 20_000
TARGET_OVERHEAD_SHARE = 0.005


def instant_engine(latency: float = 0.0) -> FakeEngine:
    """Benchmark engine: answers every ``/generate`` with the same short response, at once or after a
    fixed ``latency``. Not a model; it exists so that only the loop's own cost is measured."""
    ids = [ord("a") + i % 26 for i in range(RESPONSE_TOKENS)]
    reply = FakeReply(text=bytes(ids).decode(), ids=ids, seconds=latency, logprobs=[-0.5] * len(ids))
    return FakeEngine(lambda payload, call: reply, keep_payloads=False, model_path="bench_instant")


def mixed_reward(args: Any, sample: Sample, **kwargs: Any) -> float:
    """Alternating 0/1 within a group, all 0 in every fourth group (which the filter then drops)."""
    return 0.0 if sample.group_index % 4 == 3 else float(sample.index % 2)


def varied_reward(args: Any, sample: Sample, **kwargs: Any) -> float:
    """Alternating 0/1 within every group: the filter keeps them all."""
    return float(sample.index % 2)


class BenchPlugins:
    """The benchmark's own plugins: the instant engine and the two trivial rewards."""

    def __init__(self, latency: float) -> None:
        self.latency = latency

    @hookimpl
    def rlsdk_engines(self):
        yield Engine(name="bench_instant", func=lambda args: instant_engine(self.latency),
                     description="benchmark engine: instant fixed responses")

    @hookimpl
    def rlsdk_rewards(self):
        yield Reward(name="bench_mixed", func=mixed_reward, cheap=True)
        yield Reward(name="bench_varied", func=varied_reward, cheap=True)
        yield Reward(name="bench_mixed_threaded", func=mixed_reward)


def make_args(data: Path, step_samples: int, *, reward: str, over_sample: bool) -> RolloutConfig:
    groups = max(step_samples // N_SAMPLES, 1)
    return RolloutConfig(
        prompt_data=str(data), label_key="label", rm_type=reward, n_samples_per_prompt=N_SAMPLES,
        rollout_batch_size=groups, over_sampling_batch_size=math.ceil(groups * 4 / 3) if over_sample else groups,
        dynamic_sampling_filter_path="check_reward_nonzero_std", rollout_max_response_len=64,
        sglang_server_concurrency=max(512, groups * N_SAMPLES * 2),
    )


# ----- rlsdk ----------------------------------------------------------------------------------------

def run_rlsdk(data: Path, step_samples: int, steps: int, *, latency: float, reward: str,
              over_sample: bool) -> tuple[list[float], list[float], int]:
    """Wall and CPU step times (the first step is a warm-up, not returned) and kept samples over the
    timed steps."""
    from rlsdk_filter_hub import plugin as filter_hub

    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(filter_hub)
    pm.register(BenchPlugins(latency))
    args = make_args(data, step_samples, reward=reward, over_sample=over_sample)
    engine = pm.resolve("engine", "bench_instant").func(args)
    runtime = bind_runtime(args, Runtime(pm, engine, ByteTokenizer()))
    source = DataSource(args, pm=pm, tokenizer=runtime.tokenizer)
    times, cpu, kept = [], [], 0
    try:
        for rollout_id in range(steps + 1):
            start, cpu_start = time.perf_counter(), time.process_time()
            out = generate_rollout(args, rollout_id, source)
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - cpu_start)
            assert out.metrics["ledger/entered"] == (
                out.metrics["ledger/kept"] + out.metrics["ledger/dropped"] + out.metrics["ledger/returned"]
            ), out.metrics
            kept += sum(map(len, out.samples)) if rollout_id else 0
    finally:
        runtime.loop.close()
    return times[1:], cpu[1:], kept


# ----- the minimal loop -------------------------------------------------------------------------------

class MinimalLoop:
    """A hand-written asyncio loop doing the same work as a step, with none of rlsdk's machinery."""

    def __init__(self, args: RolloutConfig, engine: FakeEngine, reward: Any) -> None:
        self.args, self.engine, self.reward = args, engine, reward
        from rlsdk_filter_hub.dynamic import check_reward_nonzero_std

        self.keep = check_reward_nonzero_std
        rows = [json.loads(line) for line in Path(args.prompt_data).read_text().splitlines()]
        self.prompts = [(row["input"], list(row["input"].encode()), row["label"]) for row in rows]
        self.params = sampling_params_for(args)
        self.next_group = 0
        self.carry: list[list[Sample]] = []

    def fresh_groups(self, count: int) -> list[list[Sample]]:
        groups, n = [], self.args.n_samples_per_prompt
        for _ in range(count):
            g = self.next_group
            prompt, tokens, label = self.prompts[g % len(self.prompts)]
            groups.append([Sample(group_index=g, index=g * n + i, prompt=prompt, tokens=list(tokens), label=label)
                           for i in range(n)])
            self.next_group += 1
        return groups

    async def generate(self, sample: Sample) -> None:
        out = await self.engine.generate({"input_ids": sample.tokens, "sampling_params": self.params,
                                          "return_logprob": True})
        entries = out["meta_info"]["output_token_logprobs"]
        sample.tokens = sample.tokens + [e[1] for e in entries]
        sample.rollout_log_probs = [e[0] for e in entries]
        sample.response, sample.response_length = out["text"], len(entries)
        sample.status = Sample.Status.COMPLETED

    async def step(self) -> list[list[Sample]]:
        target = self.args.rollout_batch_size
        kept, self.carry = self.carry, []
        while len(kept) < target:
            chunk = self.fresh_groups(self.args.over_sampling_batch_size)
            await asyncio.gather(*(self.generate(s) for group in chunk for s in group))
            for group in chunk:
                for sample in group:
                    sample.reward = self.reward(self.args, sample)
                verdict = self.keep(self.args, group)
                if verdict.keep if isinstance(verdict, DynamicFilterOutput) else verdict:
                    kept.append(group)
        self.carry = kept[target:]
        return kept[:target]


def run_minimal(data: Path, step_samples: int, steps: int, *, latency: float, reward: str,
                over_sample: bool) -> tuple[list[float], list[float], int]:
    args = make_args(data, step_samples, reward=reward, over_sample=over_sample)
    loop = MinimalLoop(args, instant_engine(latency), mixed_reward if reward == "bench_mixed" else varied_reward)
    background = BackgroundLoop()
    times, cpu, kept = [], [], 0
    try:
        for index in range(steps + 1):
            start, cpu_start = time.perf_counter(), time.process_time()
            batch = background.run(loop.step())
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - cpu_start)
            kept += sum(map(len, batch)) if index else 0
    finally:
        background.close()
    return times[1:], cpu[1:], kept


# ----- the report -------------------------------------------------------------------------------------

def throughput(data: Path, size: int, samples: int, repeat: int) -> dict[str, Any]:
    """Kept samples per second of both loops at one step size: the best of ``repeat`` runs each, in wall
    time and in this process's CPU time (the latter is steadier on a shared machine)."""
    steps = max(3, samples // size)
    options = dict(latency=0.0, reward="bench_mixed", over_sample=True)
    row: dict[str, Any] = {"step_samples": size, "steps": steps}
    for name, run in (("baseline", run_minimal), ("rlsdk", run_rlsdk)):
        wall = cpu = 0.0
        for _ in range(repeat):
            times, cpu_times, kept = run(data, size, steps, **options)
            wall, cpu = max(wall, kept / sum(times)), max(cpu, kept / sum(cpu_times))
        row[f"{name}_samples_per_s"], row[f"{name}_cpu_samples_per_s"] = wall, cpu
    print(json.dumps(row), file=sys.stderr)
    return row


def threaded_reward(data: Path, size: int, samples: int) -> dict[str, Any]:
    """rlsdk with the same reward registered without ``cheap=True``: one worker-thread hop per sample."""
    steps = max(3, samples // size)
    times, cpu, kept = run_rlsdk(data, size, steps, latency=0.0, reward="bench_mixed_threaded", over_sample=True)
    row = {"step_samples": size, "steps": steps, "rlsdk_samples_per_s": kept / sum(times),
           "rlsdk_cpu_samples_per_s": kept / sum(cpu)}
    print(json.dumps({"threaded_reward": row}), file=sys.stderr)
    return row


def overhead(data: Path, size: int, latency: float, steps: int) -> dict[str, Any]:
    options = dict(latency=latency, reward="bench_varied", over_sample=False)
    base_times, _, _ = run_minimal(data, size, steps, **options)
    times, _, _ = run_rlsdk(data, size, steps, **options)
    step, base_step = sum(times) / len(times), sum(base_times) / len(base_times)
    report = {
        "latency_s": latency,
        "step_samples": size,
        "steps": steps,
        "rlsdk_step_s": step,
        "rlsdk_overhead_s": step - latency,
        "rlsdk_overhead_share": (step - latency) / step,
        "baseline_step_s": base_step,
        "baseline_overhead_s": base_step - latency,
        "baseline_overhead_share": (base_step - latency) / base_step,
    }
    print(json.dumps(report), file=sys.stderr)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16,64,256,1024,4096", help="step sizes in samples")
    parser.add_argument("--samples", type=int, default=16384, help="samples timed per step size (at least 3 steps)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per step size; the best counts")
    parser.add_argument("--latency", type=float, default=10.0, help="seconds per request in the overhead part")
    parser.add_argument("--latency-samples", type=int, default=1024, help="step size of the overhead part")
    parser.add_argument("--latency-steps", type=int, default=2)
    opts = parser.parse_args()
    core = pin_one_core()
    sizes = [int(s) for s in opts.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp, tuned_garbage_collector():  # rlsdk run's collector, both sides
        data = write_prompts(Path(tmp) / "prompts.jsonl", 2000)
        rows = [throughput(data, size, opts.samples, opts.repeat) for size in sizes]
        best = max(rows, key=lambda r: r["rlsdk_samples_per_s"])
        threaded = threaded_reward(data, best["step_samples"], opts.samples)
        latency = overhead(data, opts.latency_samples, opts.latency, opts.latency_steps)
    best_baseline = max(r["baseline_samples_per_s"] for r in rows)
    report = {
        "benchmark": "loop_overhead",
        "machine": machine(core),
        "inputs": {
            "step_sizes": sizes, "n_samples_per_prompt": N_SAMPLES, "response_tokens": RESPONSE_TOKENS,
            "samples_per_size": opts.samples, "reward": "sync, trivial, cheap=True", "dynamic_filter": "check_reward_nonzero_std",
            "dropped_share": 0.25, "over_sampling_batch_size": "4/3 x rollout_batch_size",
            "garbage_collector": "rlsdk run's (tuned_garbage_collector), both sides",
        },
        "throughput": rows,
        "latency": latency,
        "samples_per_s": best["rlsdk_samples_per_s"],
        "best_step_samples": best["step_samples"],
        "baseline_samples_per_s": best_baseline,
        "threaded_reward": threaded,
        "overhead_share": latency["rlsdk_overhead_share"],
        "targets": {"samples_per_s": TARGET_SAMPLES_PER_S, "overhead_share": TARGET_OVERHEAD_SHARE},
        "meets_target": best["rlsdk_samples_per_s"] >= TARGET_SAMPLES_PER_S
        and latency["rlsdk_overhead_share"] < TARGET_OVERHEAD_SHARE,
        "ratio": best["rlsdk_samples_per_s"] / best_baseline,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
