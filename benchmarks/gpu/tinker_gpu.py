"""The Tinker API on one GPU (SmolLM2-135M-Instruct, LoRA rank 32; not run in CI; the last line printed is one
JSON object). Three parts (``--parts``, default all), each against ``rlsdk tinker serve`` started here on
CUDA (trainer and embedded engine in float32) with the model served under the cookbook recipes' default name:

- ``rl``: tinker-cookbook's ``rl_loop`` recipe, unchanged, learns single-digit addition: first its
  ``sl_loop`` recipe teaches the answer format on other questions (``\\boxed{N}`` around a number the question
  names, ``--sl-steps`` steps), then ``rl_loop`` (importance sampling, ``--rl-steps`` steps of
  ``--questions`` x ``--group`` samples) resumes from that state; its ``reward/total`` per step (the fraction
  of correct boxed sums) is reported, with the means of the first and last five steps. Target: the reward
  rises (last five above first five).
- ``numerics``: the cookbook's own sampler-versus-trainer check (benchmarks/tinker_numerics.py): the largest
  per-token gap after a few cross-entropy steps, against rlsdk's trust-check tolerance (2 nats on CUDA; the
  float32 figure is far below it).
- ``overhead``: benchmarks/tinker_overhead.py at 8,192 tokens a call: ``forward_backward`` through the client
  and the server against rlsdk's trainer called in process. Target: at most 10%.

Needs the ``tinker`` and ``tinker-cookbook`` packages and their few requirements SGLang's folder lacks on the
path (device.sh's ``tinker`` phase carries them), and the model converted by the ``model`` phase::

    python3 benchmarks/gpu/tinker_gpu.py --model /tmp/rlsdk-models/SmolLM2-135M-Instruct-... [--parts rl,numerics,overhead]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = HERE.parent
NAME = "Qwen/Qwen3.5-9B-Base"  # the recipes' default: picks their role_colon renderer
SUFFIX = " Provide a numerical answer without units, written inside \\boxed{}."


def write_workdir(work: Path, model: Path, sl_rows: int, rl_rows: int) -> None:
    """The recipes' working directory: the model's name and the datasets' names as local folders. The
    supervised rows box a number the question names (the format, not the sums); the RL rows are additions."""
    rng = random.Random(0)
    (work / NAME).parent.mkdir(parents=True, exist_ok=True)
    (work / NAME).symlink_to(model)
    chats = work / "HuggingFaceH4" / "no_robots" / "train.jsonl"
    chats.parent.mkdir(parents=True)
    rows = []
    for _ in range(sl_rows):
        n = rng.randint(10, 99)
        messages = [
            {"role": "user", "content": f"Which number comes after {n - 1}?{SUFFIX}"},
            {"role": "assistant", "content": f"The number after {n - 1} is {n}. \\boxed{{{n}}}"},
        ]
        rows.append(json.dumps({"messages": messages}))
    chats.write_text("\n".join(rows) + "\n")
    gsm8k = work / "openai" / "gsm8k"
    (gsm8k / "main").mkdir(parents=True)
    (gsm8k / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n    path: main/train.jsonl\n---\n"
    )
    sums = [(rng.randint(1, 9), rng.randint(1, 9)) for _ in range(rl_rows)]
    (gsm8k / "main" / "train.jsonl").write_text(
        "".join(
            json.dumps({"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}) + "\n"
            for a, b in sums
        )
    )


def start_server(model: Path, key: str, port: int, scratch: Path, device: str) -> subprocess.Popen[bytes]:
    sys.path.insert(0, str(BENCHMARKS))
    from tinker_overhead import wait_ready

    log = scratch / "server.log"
    server = subprocess.Popen(
        [
            sys.executable, "-m", "rlsdk_cli.app", "tinker", "serve", "--model", f"{NAME}={model}",
            "--port", str(port), "--api-key", key, "--seed", "0",
            "--train-device", device, "--train-dtype", "float32",
            "--set", f"engine_device={device}", "--set", "engine_dtype=float32",
            "--checkpoint-dir", str(scratch / "checkpoints"),
        ],
        stderr=log.open("w"),
    )
    wait_ready(f"http://127.0.0.1:{port}", key, server, log)
    return server


def recipe(name: str, work: Path, env: dict[str, str], *config: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", f"tinker_cookbook.recipes.{name}", *config],
        cwd=work, env=env, capture_output=True, text=True, timeout=1800,
    )
    (work / f"{name}.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"{name} exited {done.returncode}: {(done.stdout + done.stderr)[-3000:]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="SmolLM2-135M-Instruct's converted folder")
    parser.add_argument("--parts", default="rl,numerics,overhead")
    parser.add_argument("--sl-steps", type=int, default=8)
    parser.add_argument("--sl-lr", type=float, default=1e-3)
    parser.add_argument("--rl-steps", type=int, default=20)
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rl-lr", type=float, default=1e-4)
    parser.add_argument("--device", default="cuda", help="cpu checks the script at a tiny size")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    report: dict[str, object] = {"benchmark": "tinker_gpu", "model": str(args.model), "parts": sorted(parts)}
    key = f"tml-{secrets.token_urlsafe(16)}"
    port = 8000 + secrets.randbelow(2000)
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "TINKER_BASE_URL": url,
        "TINKER_API_KEY": key,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        if parts & {"rl", "numerics"}:
            work = scratch / "work"
            work.mkdir()
            sl_batch = 8
            rl_rows = (args.sl_steps + args.rl_steps) * args.questions
            write_workdir(work, args.model, args.sl_steps * sl_batch, rl_rows)
            env["HF_HOME"] = str(scratch / "hf")
            server = start_server(args.model, key, port, scratch, args.device)
            try:
                if "rl" in parts:
                    log_path = scratch / "run"
                    sl_seconds = recipe(
                        "sl_loop", work, env, f"log_path={log_path}", f"batch_size={sl_batch}",
                        f"learning_rate={args.sl_lr}", "save_every=0",
                    )
                    rl_seconds = recipe(
                        "rl_loop", work, env, f"log_path={log_path}", f"batch_size={args.questions}",
                        f"group_size={args.group}", f"max_tokens={args.max_tokens}",
                        f"max_steps={args.sl_steps + args.rl_steps}", f"learning_rate={args.rl_lr}",
                        "save_every=0", "loss_fn=importance_sampling",
                    )
                    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
                    rewards = [row["reward/total"] for row in rows if "reward/total" in row]
                    first, last = rewards[:5], rewards[-5:]
                    report["rl"] = {
                        "sl_steps": args.sl_steps,
                        "rl_steps": len(rewards),
                        "questions_x_group": [args.questions, args.group],
                        "learning_rate": args.rl_lr,
                        "rewards": rewards,
                        "trained_steps": sum("grad_norm:mean" in row for row in rows if "reward/total" in row),
                        "first5_mean": sum(first) / len(first),
                        "last5_mean": sum(last) / len(last),
                        "rose": sum(last) / len(last) > sum(first) / len(first),
                        "sl_seconds": sl_seconds,
                        "rl_seconds": rl_seconds,
                    }
                if "numerics" in parts:
                    done = subprocess.run(
                        [sys.executable, str(BENCHMARKS / "tinker_numerics.py"), "--base-url", url,
                         "--model-name", NAME, "--tolerance", "2.0"],
                        cwd=work, env=env, capture_output=True, text=True, timeout=1200,
                    )
                    lines = done.stdout.strip().splitlines()
                    report["numerics"] = json.loads(lines[-1]) if lines else {"error": done.stderr[-3000:]}
            finally:
                server.terminate()
                server.wait(timeout=120)
                report["server_log_tail"] = (scratch / "server.log").read_text()[-2000:]
        if "overhead" in parts:
            done = subprocess.run(
                [sys.executable, str(BENCHMARKS / "tinker_overhead.py"), "--model", str(args.model),
                 "--device", args.device, "--dtype", "float32", "--tokens", "8192", "--calls", "8"],
                capture_output=True, text=True, timeout=1200,
            )
            lines = done.stdout.strip().splitlines()
            report["overhead"] = json.loads(lines[-1]) if lines else {"error": done.stderr[-3000:]}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
