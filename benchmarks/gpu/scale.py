"""A real model size on the GPU: ``rlsdk run --train`` with the megatron trainer and rlsdk-launched SGLang
colocated on the same GPU(s), memory offloaded both ways, or (``--engine-gpus N``) N engines on GPUs of
their own after the trainer's, behind the router, the weights broadcast over NCCL (not run in CI; one
device call of under 10 minutes; the last line printed is one JSON object).

The model is a published shape (``--shape``: Qwen3-4B by default; ``workload.SHAPES``) with random bf16
weights and the bench model's tokenizer. The run is exactly what a user types::

    rlsdk run --train --engine sglang --colocate --trainer megatron --hf-checkpoint MODEL \\
        --prompt-data arithmetic2-train.jsonl --rollout-max-response-len 512 ... [--offload-train ...]

(``--colocate`` turns on ``--offload-train`` and ``--offload-rollout``, as slime: SGLang releases its weights
and KV cache while the trainer trains; the trainer moves its AdamW state to CPU memory while SGLang
generates.) Per RL step (rollout, train, CUDA-IPC sync, trust check) from the run's metrics: the seconds
of each, the peak GPU memory of each phase over the whole device (trainer and SGLang together), train
tokens/s and the trainer's MFU: model FLOPs (6 x active body parameters x tokens, 6 x the vocabulary
projection x response tokens, causal attention) over the train step's seconds and the card's dense bf16
peak (989 TFLOP/s for an H100/H200 SXM). Targets: sync <= 1.0 s, MFU >= 35%.

    PYTHONPATH=/tmp/rl:benchmarks/gpu python3 benchmarks/gpu/scale.py --tokenizer .gpu/bench-model \\
        --sglang-python /tmp/sglang-python --output /tmp/scale
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from learning_gpu import arithmetic_run, failure_cause, run_until, sglang_flags
from workload import SHAPES, machine, parameter_counts, run_reporting, shape_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: learning.py
from learning import rows  # noqa: E402

PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12}
"""Dense bf16 tensor-core FLOP/s of the SXM cards (the vendor's datasheets)."""
TARGET_SYNC_SECONDS = 1.0
TARGET_MFU = 0.35
PHASES = ("rollout", "train", "sync")


def run_command(opts: argparse.Namespace, model: Path, out: Path) -> list[str]:
    command = [
        *arithmetic_run(opts, model, out),
        "--engine",
        "sglang",
        *layout_options(opts),
        *sglang_flags(opts),
        "--trainer",
        "megatron",
        "--train-dtype",
        "bfloat16",
        "--tensor-model-parallel-size",
        str(opts.tp),
        "--expert-model-parallel-size",
        str(opts.ep),
        "--actor-num-gpus-per-node",
        str(opts.gpus),
        "--global-batch-size",
        str(opts.prompts * opts.samples),  # one optimizer step a step
        "--lr",
        "1e-6",
    ]
    return command + opts.extra


def layout_options(opts: argparse.Namespace) -> list[str]:
    """Colocated (``--engine-gpus 0``), or ``--engine-gpus`` one-GPU SGLang engines on the GPUs after the
    trainer's (the router in front of more than one), the weights broadcast to them over NCCL."""
    if not opts.engine_gpus:
        return ["--colocate"]
    return ["--rollout-num-gpus", str(opts.engine_gpus), "--weight-sync", "nccl"]


def flops_per_step(
    config: dict[str, Any], train_tokens: float, response_tokens: float, samples: int
) -> float:
    """Model FLOPs of one train step's forward and backward passes (no recomputation counted)."""
    counts = parameter_counts(config)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    attention_width = config["num_attention_heads"] * head_dim * config["num_hidden_layers"]
    length = train_tokens / max(samples, 1)
    attention = 6 * attention_width * samples * length * length  # QK^T and PV, causal half, x3 for backward
    return 6 * counts["active"] * train_tokens + 6 * counts["output"] * response_tokens + attention


def step_report(row: dict[str, Any], config: dict[str, Any], peak: float | None) -> dict[str, Any]:
    seconds = row.get("train/seconds") or 0.0
    tokens = (row.get("train/tokens_per_s") or 0.0) * seconds
    flops = flops_per_step(
        config, tokens, row.get("rollout/tokens") or 0.0, int(row.get("train/samples") or 0)
    )
    report = {
        "rollout_seconds": row.get("rollout/seconds"),
        "rollout_tokens_per_s": row.get("rollout/tokens_per_s"),
        "train_seconds": seconds,
        "train_tokens": tokens,
        "train_tokens_per_s": row.get("train/tokens_per_s"),
        "offload_seconds": row.get("train/offload_seconds"),
        "sync_seconds": row.get("train/sync_seconds"),
        "sync_parts": {
            k.removeprefix("train/sync_"): v
            for k, v in row.items()
            if k.startswith("train/sync_") and k.endswith("_seconds") and k != "train/sync_seconds"
        },
        "sync_buckets": row.get("train/sync_buckets"),
        "trust_check_seconds": row.get("train/trust_check_seconds"),
        "trust_check_max_diff": row.get("train/sync_logprob_max_diff"),
        "peak_gpu_gb": {p: row.get(f"memory/peak_gpu_gb_{p}") for p in PHASES},
        "trainer_peak_allocated_gb": row.get("train/peak_memory_gb"),
        "model_tflops": flops / 1e12,
        "mfu": flops / seconds / peak if peak and seconds else None,
    }
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in report.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="qwen3-4b", choices=sorted(SHAPES))
    parser.add_argument("--tokenizer", default=".gpu/bench-model", help="a folder with tokenizer files")
    parser.add_argument("--model", help="a folder shape_checkpoint already wrote (default: write one)")
    parser.add_argument("--sglang-python", default="/tmp/sglang-python")
    parser.add_argument("--output", default="/tmp/scale")
    parser.add_argument(
        "--mem-fraction", type=float, help="SGLang's --mem-fraction-static (default 0.45 colocated, else 0.8)"
    )
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--ep", type=int, default=1)
    parser.add_argument("--gpus", type=int, default=1, help="trainer GPUs (actor_num_gpus_per_node)")
    parser.add_argument(
        "--engine-gpus",
        type=int,
        default=0,
        help="0: SGLang colocated with the trainer; N: N one-GPU engines after the trainer's GPUs, NCCL sync",
    )
    parser.add_argument("--steps", type=int, default=6, help="RL steps (the first warms up)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--response-len", type=int, default=512)
    parser.add_argument("--minutes", type=float, default=7.5, help="stop the run after this long")
    parser.add_argument("extra", nargs="*", help="more rlsdk run options (after --)")
    opts = parser.parse_args()
    if opts.mem_fraction is None:
        opts.mem_fraction = 0.8 if opts.engine_gpus else 0.45

    import torch

    out = Path(opts.output)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    model = (
        Path(opts.model)
        if opts.model
        else shape_checkpoint(opts.shape, opts.tokenizer, out / "model", device="cuda")
    )
    checkpoint_seconds = time.perf_counter() - started
    config = json.loads((model / "config.json").read_text())
    card = torch.cuda.get_device_name(0)
    peak = next((flops for name, flops in PEAK_BF16.items() if name in card), None)
    command = run_command(opts, model, out / "run")
    started = time.perf_counter()
    code, timed_out = run_until(command, out / "run.log", opts.minutes)
    minutes = (time.perf_counter() - started) / 60
    steps = [step_report(row, config, peak) for row in rows(out / "run" / "metrics.jsonl")]
    measured = steps[1:] or steps  # the first step warms up (CUDA graphs, allocator, kernels)

    def median(key: str) -> float | None:
        values = [s[key] for s in measured if s.get(key) is not None]
        return round(statistics.median(values), 4) if values else None

    peaks = {p: max((s["peak_gpu_gb"][p] or 0.0 for s in steps), default=None) for p in PHASES}
    report = {
        "benchmark": "scale",
        "shape": opts.shape,
        "layout": {"trainer_gpus": opts.gpus, "tp": opts.tp, "ep": opts.ep, "engine_gpus": opts.engine_gpus},
        "parameters": parameter_counts(config),
        "exit_code": code,
        "timed_out": timed_out,
        "failure": None
        if code == 0 or (timed_out and steps)
        else failure_cause(out / "run.log") or f"exit {code}",
        "steps": len(steps),
        "step_seconds_median": median_step(measured),
        "sync_seconds_median": median("sync_seconds"),
        "train_seconds_median": median("train_seconds"),
        "rollout_seconds_median": median("rollout_seconds"),
        "mfu_median": median("mfu"),
        "train_tokens_per_s_median": median("train_tokens_per_s"),
        "peak_gpu_gb_per_phase": peaks,
        "targets": {"sync_seconds": TARGET_SYNC_SECONDS, "mfu": TARGET_MFU},
        "meets_sync_target": (median("sync_seconds") or 1e9) <= TARGET_SYNC_SECONDS,
        "meets_mfu_target": (median("mfu") or 0.0) >= TARGET_MFU,
        "per_step": steps,
        "checkpoint_seconds": round(checkpoint_seconds, 1),
        "minutes": round(minutes, 2),
        "peak_bf16_flops": peak,
        "command": " ".join(run_command(opts, Path("MODEL"), Path("OUT"))),
        "machine": machine(),
    }
    print(json.dumps(report))


def median_step(steps: list[dict[str, Any]]) -> float | None:
    """The median of rollout + train + sync + trust check seconds over the measured steps."""
    keys = ("rollout_seconds", "train_seconds", "sync_seconds", "trust_check_seconds")
    totals = [sum(s[k] or 0.0 for k in keys) for s in steps]
    return round(statistics.median(totals), 3) if totals else None


if __name__ == "__main__":
    run_reporting(main, "scale")
