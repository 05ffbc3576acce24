"""Learning on one GPU: does ``rlsdk run --train`` with rlsdk-launched, colocated SGLang raise the held-out
reward of SmolLM2-135M-Instruct (its real weights) on two-digit arithmetic within minutes? (Not run in CI;
one device call of under 10 minutes; the last line printed is one JSON object.)

Runs, in a subprocess exactly as a user types it::

    rlsdk run --train --engine sglang|vllm --colocate --hf-checkpoint MODEL --trainer torch|megatron \\
        --prompt-data .../arithmetic2-train.jsonl --eval-prompt-data arithmetic2 .../arithmetic2-eval.jsonl ...

GRPO, 32 prompts x 8 samples a step, two optimizer steps a step, the old policy's log-probs recomputed by
the trainer (SGLang's bfloat16 ones differ by more than the clip range on the odd token), evals of the
192 held-out problems (4 samples each, temperature 1) before the first step and every 5 steps. The
trainer keeps float32 weights and AdamW state (``--train-dtype``; TF32 matmuls): AdamW steps of about
``lr`` = 1e-5 are below half a bfloat16 step for most weights and would round away. SGLang serves
bfloat16, so the trust check uses rlsdk's CUDA tolerance. The run stops at ``--minutes`` (SIGINT, so rlsdk stops SGLang) if it has not finished; the
held-out end is the last eval written. Reported: the held-out mean reward at the start and the end, per
step the rollout, train and sync seconds, the trust check's largest log-prob gap, the exit code, and the
failure cause (the log's last error line) if any. Target: ``heldout_reward_end - heldout_reward_start >=
0.2`` within 10 minutes on one H100, with either trainer.

``MODEL`` is ``--model`` (a Hugging Face folder) or ``--gguf`` (SmolLM2-135M-Instruct.Q4_1.gguf, converted
once into ``--cache-dir`` as the embedded engine does). On a CPU the same command with ``--engine
embedded`` (and no ``--colocate``) checks the script: ``--engine embedded --steps 2 --prompts 4 --samples 4
--heldout FIRST_ROWS.jsonl`` (a few rows of the eval file: all 192 take minutes on a CPU).

    PYTHONPATH=/tmp/rl:benchmarks/gpu python3 benchmarks/gpu/learning_gpu.py --trainer torch \\
        --gguf /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf --sglang-python /tmp/sglang-python
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: learning.py
from learning import RUN_TRAIN, heldout_curve, rows  # noqa: E402
from workload import machine, run_reporting  # noqa: E402

TARGET_GAIN = 0.2
STEP_METRICS = {
    "rollout_seconds": "rollout/seconds",
    "train_seconds": "train/seconds",
    "sync_seconds": "train/sync_seconds",
    "trust_check_seconds": "train/trust_check_seconds",
    "reward": "rollout/reward_mean",
    "sync_logprob_max_diff": "train/sync_logprob_max_diff",
    "rollout_logprob_diff": "train/rollout_logprob_diff",
}


def model_folder(opts: argparse.Namespace) -> Path:
    if opts.model:
        return Path(opts.model).resolve()
    if not opts.gguf:
        raise SystemExit("pass --model (a Hugging Face folder) or --gguf (SmolLM2-135M-Instruct.Q4_1.gguf)")
    from rlsdk_embedded.model_files import converted_gguf

    return converted_gguf(Path(opts.gguf).resolve(), opts.cache_dir)


def shipped(name: str) -> Path:
    """A dataset shipped inside the installed rlsdk package."""
    import rlsdk

    return Path(rlsdk.__file__).parent / "datasets" / name


def arithmetic_run(opts: argparse.Namespace, model: Path, out: Path) -> list[str]:
    """``rlsdk run --train`` on ``model`` into ``out`` over the shipped two-digit arithmetic prompts (chat
    template applied), its steps' size from ``opts``: ``steps``, ``prompts``, ``samples``, ``micro_batch``
    and ``response_len``."""
    return [
        *RUN_TRAIN,
        "--output",
        str(out),
        "--overwrite",
        "--hf-checkpoint",
        str(model),
        "--prompt-data",
        str(shipped("arithmetic2-train.jsonl")),
        "--label-key",
        "label",
        "--apply-chat-template",
        "--num-rollout",
        str(opts.steps),
        "--rollout-batch-size",
        str(opts.prompts),
        "--n-samples-per-prompt",
        str(opts.samples),
        "--micro-batch-size",
        str(opts.micro_batch),
        "--rollout-max-response-len",
        str(opts.response_len),
    ]


def sglang_flags(opts: argparse.Namespace) -> list[str]:
    """SGLang from ``opts.sglang_python`` in bfloat16, with ``opts.mem_fraction`` of the GPU's memory."""
    return [
        "--sglang-python",
        opts.sglang_python,
        "--sglang-dtype",
        "bfloat16",
        "--sglang-mem-fraction-static",
        str(opts.mem_fraction),
    ]


def run_command(opts: argparse.Namespace, model: Path, out: Path) -> list[str]:
    command = [
        *arithmetic_run(opts, model, out),
        "--engine",
        opts.engine,
        "--trainer",
        opts.trainer,
        "--rollout-shuffle",
        "--eval-prompt-data",
        "arithmetic2",
        str(opts.heldout or shipped("arithmetic2-eval.jsonl")),
        "--global-batch-size",
        str(opts.prompts * opts.samples // 2),
        "--lr",
        str(opts.lr),
        "--eps-clip-high",
        "0.28",
        "--eval-interval",
        str(opts.eval_interval),
        "--n-samples-per-eval-prompt",
        "4",
        "--train-dtype",
        opts.train_dtype,
    ]
    if opts.async_:  # the next rollout generates while the trainer trains (one step off-policy)
        command += ["--async"]
    if opts.lag is not None:  # engines up to LAG versions ahead of the trainer
        command += ["--max-policy-version-lag", str(opts.lag)]
    if opts.ray:  # an SGLang engine actor on one GPU, the trainer actor on another; weights from disk
        command += ["--ray", *(["--rollout-num-gpus", "1"] if opts.engine == "sglang" else [])]
    if opts.engine == "sglang":
        command += [*([] if opts.ray else ["--colocate"]), *sglang_flags(opts)]
    elif opts.engine == "vllm":  # the rlsdk-engine-vllm plugin: vLLM 0.26 from its own environment
        command += [
            "--colocate",
            "--vllm-python",
            opts.vllm_python,
            "--vllm-args",
            f"--dtype bfloat16 --gpu-memory-utilization {opts.mem_fraction}",
        ]
    else:  # the embedded engine loads --model, not --hf-checkpoint
        command += ["--model", str(model)]
    return command + opts.extra


def run_until(command: list[str], log: Path, minutes: float) -> tuple[int | None, bool]:
    """Run ``command`` (output to ``log``) for at most ``minutes``; past it SIGINT (rlsdk then stops its
    SGLang servers), SIGKILL a minute later. Returns the exit code and whether time ran out."""
    env = {
        **os.environ,
        "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1",
    }  # the float32 trainer's matmuls on tensor cores
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            return process.wait(timeout=minutes * 60), False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            return process.returncode, True


def failure_cause(log: Path) -> str | None:
    """The last line of the log that reads as an error (``Error: ...``, an exception), if any."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    pattern = re.compile(r"^(Error|\w+(Error|Exception)\b)|\bError: ")
    found = [line.strip() for line in lines if pattern.search(line.strip())]
    return found[-1][:1000] if found else None


def heldout_minutes(evals: list[dict]) -> list[tuple[float, float]]:
    """``(minutes since the steps began, held-out reward)`` of each eval (the one before the first step
    at 0)."""
    key = next((k for row in evals for k in row if k.endswith("/reward_mean")), None)
    return [
        (round(row.get("run/elapsed_seconds", 0.0) / 60, 3), round(row[key], 4))
        for row in evals
        if key in row
    ]


def step_rows(out: Path) -> list[dict[str, Any]]:
    """``metrics.jsonl``'s rows, each with its step's wall-clock figures, which a ``--deterministic`` run
    writes to ``timings.jsonl`` instead."""
    timings = {
        row["rollout_id"]: row for row in rows(out / "timings.jsonl") if row["file"] == "metrics.jsonl"
    }
    return [{**timings.get(row.get("rollout_id"), {}), **row} for row in rows(out / "metrics.jsonl")]


def summary(
    opts: argparse.Namespace, out: Path, code: int | None, timed_out: bool, minutes: float, log: Path
) -> dict[str, Any]:
    steps, curve = step_rows(out), heldout_curve(rows(out / "eval.jsonl"))
    start, end = (curve[0][1], curve[-1][1]) if curve else (None, None)
    per_step = {
        name: [round(row[key], 4) for row in steps if row.get(key) is not None]
        for name, key in STEP_METRICS.items()
    }
    diffs = per_step["sync_logprob_max_diff"]
    elapsed = [row["run/elapsed_seconds"] for row in steps if "run/elapsed_seconds" in row]
    span = elapsed[-1] - elapsed[0] if len(elapsed) > 1 else None  # steps 1..N: no start-up, no first eval
    samples = [row.get("rollout/samples", 0) for row in steps]
    gain = round(end - start, 4) if curve else None
    report = {
        "benchmark": "learning_gpu",
        "trainer": opts.trainer,
        "engine": opts.engine,
        "ray": opts.ray,
        "exit_code": code,
        "timed_out": timed_out,
        "minutes": round(minutes, 2),
        "steps": len(steps),
        "heldout_reward_start": start,
        "heldout_reward_end": end,
        "heldout_gain": gain,
        "heldout_curve": curve,
        "heldout_minutes": heldout_minutes(rows(out / "eval.jsonl")),
        "mode": "async" if opts.async_ else f"lag{opts.lag}" if opts.lag is not None else "sync",
        "response_len": opts.response_len,
        "elapsed_seconds": elapsed,
        "steps_per_minute": round(60 * (len(elapsed) - 1) / span, 3) if span else None,
        "samples_per_minute": round(60 * sum(samples[1:]) / span, 1) if span else None,
        "median_seconds": {
            name: sorted(per_step[name])[len(per_step[name]) // 2] if per_step[name] else None
            for name in ("rollout_seconds", "train_seconds", "sync_seconds")
        },
        "sync_logprob_max_diff": max(diffs) if diffs else None,
        "per_step": per_step,
        "failure": None if code == 0 or (timed_out and steps) else failure_cause(log) or f"exit code {code}",
        "target_gain": TARGET_GAIN,
        "meets_target": gain is not None and gain >= TARGET_GAIN and minutes <= 10,
        "output": str(out),
        "command": " ".join(run_command(opts, Path("MODEL"), out)),
    }
    return report


def options() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trainer", default="torch", help="torch or megatron")
    parser.add_argument(
        "--engine",
        default="sglang",
        help="sglang or vllm (launched, colocated), or embedded (a CPU check)",
    )
    parser.add_argument(
        "--ray",
        action="store_true",
        help="on a local Ray cluster: the SGLang engine and the trainer as actors, a GPU each (two GPUs)",
    )
    parser.add_argument("--model", help="a Hugging Face folder of SmolLM2-135M-Instruct")
    parser.add_argument("--gguf", help="SmolLM2-135M-Instruct.Q4_1.gguf, converted once into --cache-dir")
    parser.add_argument("--cache-dir", default="/tmp/rlsdk-models")
    parser.add_argument("--sglang-python", default="/tmp/sglang-python")
    parser.add_argument("--vllm-python", default="/tmp/vllm-python")
    parser.add_argument(
        "--mem-fraction",
        type=float,
        default=0.4,
        help="SGLang's --mem-fraction-static (vLLM's --gpu-memory-utilization with --engine vllm)",
    )
    parser.add_argument(
        "--minutes", type=float, default=8.0, help="stop the run after this long (conversion excluded)"
    )
    parser.add_argument(
        "--steps", type=int, default=80, help="rollout steps (the time limit usually comes first)"
    )
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--train-dtype", default="float32")
    parser.add_argument("--eval-interval", type=int, default=5)
    parser.add_argument(
        "--async", dest="async_", action="store_true", help="rlsdk run --async (one step off-policy)"
    )
    parser.add_argument("--lag", type=int, default=None, help="rlsdk run --max-policy-version-lag LAG")
    parser.add_argument("--response-len", type=int, default=64, help="--rollout-max-response-len")
    parser.add_argument("--heldout", help="the eval file (default the shipped arithmetic2-eval.jsonl)")
    parser.add_argument(
        "--output", type=Path, default=None, help="the run's folder (default a temporary one)"
    )
    parser.add_argument("extra", nargs="*", help="more `rlsdk run` options (after --)")
    return parser


def main() -> None:
    opts = options().parse_args()
    out = (opts.output or Path(tempfile.mkdtemp(prefix="rlsdk-learning-gpu-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    model = model_folder(opts)
    converted = time.perf_counter() - started
    log = out.parent / f"{out.name}.log"
    command = run_command(opts, model, out)
    print(" ".join(command), file=sys.stderr, flush=True)
    started = time.perf_counter()
    code, timed_out = run_until(command, log, opts.minutes)
    minutes = (time.perf_counter() - started) / 60
    sys.stderr.write(log.read_text(errors="replace")[-20000:])
    report = summary(opts, out, code, timed_out, minutes, log)
    report["model"], report["model_seconds"] = str(model), round(converted, 1)
    report["machine"] = machine()
    print(json.dumps(report))


if __name__ == "__main__":
    run_reporting(main, "learning_gpu", key="failure")
