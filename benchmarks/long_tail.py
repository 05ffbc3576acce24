"""Long-tail rollouts: slime's synchronous loop against over-sampling plus partial rollouts, in simulated time.

The engine (``simulated_engine``, a :class:`rlsdk.testing.FakeEngine`) gives each sample a response length
drawn from a capped log-normal (median ``--median-len``, sigma ``--sigma``, cap ``--max-len``), keyed by the
prompt and the sample's position so both modes see the same lengths, and spends a fixed
``--time-per-token`` per token on at most ``--slots`` requests at once (the rest queue, as in a continuously batching server). Time is an event
loop's virtual clock that jumps to the next finishing request whenever the loop is idle, so hours of
generation simulate in seconds; abort returns what each request generated so far.

Both modes run rlsdk's own ``generate_rollout`` (slime's entry point) on the same engine settings, data,
reward (a per-prompt pass rate) and dynamic filter (``check_reward_nonzero_std``, as in DAPO), with the
same kept batch of ``--batch-size`` groups per step:

- **sync** (baseline), slime's synchronous mode: ``over_sampling_batch_size == rollout_batch_size``, no
  partial rollout. Each chunk's groups all run to the end; when the filter drops groups another chunk
  follows, and what is still running when the batch is full is aborted and started over later;
- **partial**: ``over_sampling_batch_size = --over-sampling x rollout_batch_size`` and
  ``partial_rollout``: the step ends as soon as the batch is full, the long tail is aborted and resumes
  from its tokens next step.

``ratio`` is sync's mean step time over partial's (above 1: partial rollouts give shorter steps; target
1.5). Tokens wasted: generated tokens that are in no kept sample and not held in the buffer at the end.
Samples lost, from the step ledgers, must be 0.

    python benchmarks/long_tail.py [--steps 30] [--batch-size 32] [--over-sampling 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import selectors
import statistics
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any

from harness import machine, write_prompts

from rlsdk import Engine, Reward, RolloutConfig, Sample, get_plugin_manager, hookimpl
from rlsdk.data import DataSource
from rlsdk.rollout.step import generate_rollout
from rlsdk.runtime import Runtime, bind_runtime
from rlsdk.testing import ByteTokenizer, FakeEngine, FakeReply

N_SAMPLES = 8
TOKEN_BASE = 1000
"""Generated token ids are ``TOKEN_BASE + target length``: a resumed request carries its own target."""


# ----- virtual time -----------------------------------------------------------------------------------

class _JumpingSelector(selectors.DefaultSelector):
    """Polls I/O without waiting; when the loop would sleep until its next timer, the clock jumps there."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None or timeout <= 0:
            return super().select(timeout)  # nothing scheduled: wait for real work (a new step)
        events = super().select(0)
        if not events:
            self.now += timeout
        return events


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on simulated time: ``asyncio.sleep(60)`` returns at once, 60 s later on ``time()``.
    Only valid while nothing runs in threads (the benchmark's reward is ``cheap``, so none does)."""

    def __init__(self) -> None:
        self._jumping = _JumpingSelector()
        super().__init__(self._jumping)

    def time(self) -> float:
        return self._jumping.now


class VirtualClockPolicy(asyncio.DefaultEventLoopPolicy):
    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return VirtualClockLoop()


# ----- the simulated engine -----------------------------------------------------------------------------

class LengthTokenizer(ByteTokenizer):
    """Decodes simulated tokens (ids of ``TOKEN_BASE`` and up) as one ``x`` each."""

    def decode(self, ids: list[int]) -> str:
        return "x" * len(ids)


def simulated_engine(*, slots: int, time_per_token: float, median_len: float, sigma: float,
                     seed: int) -> FakeEngine:
    """Benchmark engine: capped log-normal response lengths, a fixed time per token, ``slots`` requests
    running at once, on the loop's (virtual) clock. Not a model."""
    mu = math.log(median_len)

    def target_length(prompt_ids: list[int], position: int, cap: int) -> int:
        key = zlib.crc32(bytes(prompt_ids)) ^ (position * 0x9E3779B1) ^ seed
        return max(1, min(cap, round(random.Random(key).lognormvariate(mu, sigma))))

    def respond(payload: dict[str, Any], call: int) -> FakeReply:
        ids, params = payload["input_ids"], payload["sampling_params"]
        done_before = 0
        while done_before < len(ids) and ids[len(ids) - 1 - done_before] >= TOKEN_BASE:
            done_before += 1
        if done_before:  # a partial rollout resuming: its tokens carry the target length
            target = ids[-1] - TOKEN_BASE
        else:
            target = target_length(ids, params.get("sampling_seed", 0), params["max_new_tokens"])
        n = min(target - done_before, params["max_new_tokens"])
        return FakeReply(ids=[TOKEN_BASE + target] * n, seconds=n * time_per_token)

    return FakeEngine(respond, LengthTokenizer(), slots=slots, keep_payloads=False,
                      model_path="bench_simulated")



def pass_rate_reward(args: Any, sample: Sample, **kwargs: Any) -> float:
    """1 or 0, with a pass rate fixed per prompt (uniform over prompts): some groups all pass or all
    fail, and the dynamic filter drops them (about 2/9 of groups with 8 samples)."""
    rate = random.Random(zlib.crc32(sample.prompt.encode())).random()
    return float(random.Random(zlib.crc32(f"{sample.prompt}|{sample.index}".encode())).random() < rate)


class SimulatedPlugins:
    """The benchmark's own plugins: the simulated engine and its reward."""

    def __init__(self, **engine_options: Any) -> None:
        self.engine_options = engine_options

    @hookimpl
    def rlsdk_engines(self):
        yield Engine(name="bench_simulated", func=lambda args: simulated_engine(**self.engine_options),
                     description="benchmark engine: long-tail lengths on a virtual clock")

    @hookimpl
    def rlsdk_rewards(self):
        yield Reward(name="bench_pass_rate", func=pass_rate_reward, cheap=True)


# ----- one mode -------------------------------------------------------------------------------------

def run_mode(mode: str, opts: argparse.Namespace, data: Path) -> dict[str, Any]:
    from rlsdk_filter_hub import plugin as filter_hub

    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(filter_hub)
    pm.register(SimulatedPlugins(slots=opts.slots, time_per_token=opts.time_per_token, median_len=opts.median_len,
                                 sigma=opts.sigma, seed=opts.seed))
    partial = mode == "partial"
    args = RolloutConfig(
        prompt_data=str(data), label_key="label", rm_type="bench_pass_rate", n_samples_per_prompt=N_SAMPLES,
        rollout_batch_size=opts.batch_size,
        over_sampling_batch_size=math.ceil(opts.batch_size * opts.over_sampling) if partial else opts.batch_size,
        partial_rollout=partial, dynamic_sampling_filter_path="check_reward_nonzero_std",
        rollout_max_response_len=opts.max_len, sglang_enable_deterministic_inference=True,
        sglang_server_concurrency=100_000, generate_timeout=None, rollout_seed=0,
    )
    engine = pm.resolve("engine", "bench_simulated").func(args)
    runtime = bind_runtime(args, Runtime(pm, engine, ByteTokenizer()))  # its loop keeps virtual time
    source = DataSource(args, pm=pm, tokenizer=runtime.tokenizer)
    clock = runtime.loop.loop.time
    step_times, kept_tokens, kept_samples, lost, aborted = [], 0, 0, 0, 0
    try:
        for rollout_id in range(opts.steps):
            start = clock()
            out = generate_rollout(args, rollout_id, source)
            step_times.append(clock() - start)
            m = out.metrics
            if m["ledger/failed"]:
                raise RuntimeError(f"{mode} step {rollout_id}: {m['rollout/failures'][:3]}")
            lost += m["ledger/entered"] - (m["ledger/kept"] + m["ledger/dropped"] + m["ledger/returned"]
                                           + m["ledger/failed"])
            kept_samples += m["ledger/kept"]
            kept_tokens += sum(s.response_length for g in out.samples for s in g)
            aborted += m["rollout/aborted"]
    finally:
        runtime.loop.close()
    buffered = sum(s.response_length for g in source.buffer for s in g)
    total_time = sum(step_times)
    report = {
        "mode": mode,
        "over_sampling_batch_size": args.over_sampling_batch_size,
        "partial_rollout": partial,
        "step_s_mean": total_time / len(step_times),
        "step_s_median": statistics.median(step_times),
        "step_s_max": max(step_times),
        "kept_samples": kept_samples,
        "tokens_generated": engine.generated_tokens,
        "tokens_kept": kept_tokens,
        "tokens_in_buffer_at_end": buffered,
        "tokens_wasted": engine.generated_tokens - kept_tokens - buffered,
        "samples_aborted": aborted,
        "samples_lost": lost,
        "slot_utilization": engine.busy_seconds / (opts.slots * total_time),
    }
    report["tokens_wasted_share"] = report["tokens_wasted"] / max(engine.generated_tokens, 1)
    print(json.dumps(report), file=sys.stderr)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32, help="kept groups per step (rollout_batch_size)")
    parser.add_argument("--over-sampling", type=float, default=2.0, help="partial mode: chunk size / batch size")
    parser.add_argument("--slots", type=int, default=256, help="requests the engine runs at once")
    parser.add_argument("--time-per-token", type=float, default=0.01, help="simulated seconds per token")
    parser.add_argument("--median-len", type=float, default=1000.0)
    parser.add_argument("--sigma", type=float, default=1.0, help="log-normal sigma of response lengths")
    parser.add_argument("--max-len", type=int, default=8192, help="length cap (rollout_max_response_len)")
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args()
    asyncio.set_event_loop_policy(VirtualClockPolicy())
    with tempfile.TemporaryDirectory() as tmp:
        data = write_prompts(Path(tmp) / "prompts.jsonl", 20_000)
        sync = run_mode("sync", opts, data)
        partial = run_mode("partial", opts, data)
    report = {
        "benchmark": "long_tail",
        "machine": machine(),
        "inputs": {
            "steps": opts.steps, "rollout_batch_size": opts.batch_size, "n_samples_per_prompt": N_SAMPLES,
            "over_sampling": opts.over_sampling, "slots": opts.slots, "time_per_token_s": opts.time_per_token,
            "response_len": {"distribution": "log-normal", "median": opts.median_len, "sigma": opts.sigma,
                             "cap": opts.max_len},
            "dynamic_filter": "check_reward_nonzero_std", "seed": opts.seed, "time": "simulated",
        },
        "sync": sync,
        "partial": partial,
        "step_s_sync": sync["step_s_mean"],
        "step_s_partial": partial["step_s_mean"],
        "samples_lost": sync["samples_lost"] + partial["samples_lost"],
        "target_ratio": 1.5,
        "meets_target": sync["step_s_mean"] / partial["step_s_mean"] >= 1.5
        and sync["samples_lost"] + partial["samples_lost"] == 0,
        "ratio": sync["step_s_mean"] / partial["step_s_mean"],
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
