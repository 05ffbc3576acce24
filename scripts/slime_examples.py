"""slime's examples under ``rlsdk run``, from their own launch scripts, on this machine's CPU.

For each example it reads the launch script from a slime checkout (its HEAD), takes the flags the script gives
slime's ``train.py`` (its ``*_ARGS`` arrays and literal flags), applies the changes docs/slime.md lists for
that example (and only those), runs ``rlsdk run`` on SmolLM2-135M-Instruct (or ``--model``) at a CPU's scale,
and prints one JSON line per example: its status, the changes made, and what the run measured. slime's own
modules and example files are used as they are: ``examples/`` is copied beside the run (slime's checkout holds
a ``slime/`` package that would hide rlsdk's stand-ins for the slime modules it cannot import here).

    python scripts/slime_examples.py SLIME_GIT_DIR [--examples fully_async ...] [--model FOLDER]

On one GPU (benchmarks/gpu/device.sh's ``slime_examples`` phase): ``--gpu --sglang-python PYTHON`` runs the same
on SGLang (rlsdk launches it; the OPD teacher is an SGLang server too) at a GPU's scale. ``SLIME_GIT_DIR`` may
also be a folder holding slime's ``examples/`` (as ``git archive HEAD examples`` gives it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCRIPTS = {
    "eval_multi_task": "examples/eval_multi_task/multi_task.sh",
    "fully_async": "examples/fully_async/run-qwen2.5-0.5B-fully_async.sh",
    "on_policy_distillation": "examples/on_policy_distillation/run-qwen3-8B-opd.sh",
    "on_policy_distillation_megatron": "examples/on_policy_distillation/run-qwen3-8B-opd-megatron.sh",
    "delta_weight_sync": "examples/delta_weight_sync/run-glm4.7-30B-A3B-delta.sh",
    "train_infer_mismatch_helper": "examples/train_infer_mismatch_helper/run-qwen3-4b-mis.sh",
    "geo3k_vlm": "examples/geo3k_vlm/run_geo3k_qwen35.sh",
}
CPU_SCALE = [
    "--num-rollout",
    "2",
    "--rollout-batch-size",
    "2",
    "--n-samples-per-prompt",
    "4",
    "--rollout-max-response-len",
    "32",
    "--global-batch-size",
    "8",
    "--eval-max-response-len",
    "32",
]
"""The one change every example gets: a CPU's scale (flags given later win)."""
GPU_SCALE = [
    "--num-rollout",
    "4",
    "--rollout-batch-size",
    "16",
    "--n-samples-per-prompt",
    "4",
    "--rollout-max-response-len",
    "256",
    "--global-batch-size",
    "64",
    "--eval-max-response-len",
    "256",
    "--sglang-mem-fraction-static",
    "0.35",
]
"""On one GPU: SGLang launched by rlsdk beside the trainer (and an OPD teacher's server), SmolLM2's scale."""
MACHINE_FLAGS = {
    "--actor-num-nodes",
    "--actor-num-gpus-per-node",
    "--rollout-num-gpus",
    "--rollout-num-gpus-per-engine",
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--context-parallel-size",
    "--expert-model-parallel-size",
    "--max-tokens-per-gpu",
    "--sglang-mem-fraction-static",
}
"""The GPU layout: the machine's, left out on a CPU (one process trains, the embedded engine serves)."""
DROPPED = {
    "--ref-load": "slime's reference is a Megatron torch_dist checkpoint; rlsdk's is the starting HF model",
    "--load": "a Megatron checkpoint to resume from; rlsdk resumes with --resume",
    "--save": "slime's checkpoint folder; rlsdk saves under --output",
    "--save-interval": "with --save",
    "--use-wandb": "rlsdk logs to wandb with --rollout-log wandb (offline)",
    "--wandb-project": "with --use-wandb",
    "--wandb-group": "with --use-wandb",
    "--wandb-key": "with --use-wandb",
    "--disable-wandb-random-suffix": "with --use-wandb",
}
"""Flags slime's scripts give that name slime's own checkpoints or services, and why each is left out."""


def script_text(slime: Path, path: str) -> str:
    """A file of slime's: from the checkout's HEAD, or from a folder of slime's files."""
    if not (slime / ".git").exists() and (slime / path).is_file():
        return (slime / path).read_text()
    return subprocess.run(
        ["git", "-C", str(slime), "show", f"HEAD:{path}"], capture_output=True, text=True, check=True
    ).stdout


def train_flags(text: str, env: dict[str, str]) -> tuple[list[str], str]:
    """The flags the script's ``train.py`` (or ``train_async.py``) call gets, its arrays expanded (``MODEL_ARGS``,
    sourced from slime's model scripts, is Megatron's architecture: rlsdk reads the model's config)."""
    arrays = {name: body for name, body in re.findall(r"^\s*([A-Z_]+)=\(\n(.*?)^\s*\)", text, re.S | re.M)}
    match = re.search(
        r"python3 \"?\$?\{?[A-Z_]*\}?/?(train(?:_async)?\.py)\"?(.*?)(?:\n\s*\n|\Z)", text, re.S
    )
    assert match, "the script calls no train.py"
    driver, call = match.group(1), match.group(2).replace("\\\n", " ")
    flags: list[str] = []
    for token in shlex.split(call, comments=True):
        name = re.fullmatch(r"\"?\$\{([A-Z_]+)\[@\]\}\"?", token)
        if name:
            if name.group(1) != "MODEL_ARGS":
                flags += shlex.split(expand(arrays.get(name.group(1), ""), env), comments=True)
        else:
            flags.append(expand(token, env))
    return flags, driver


def expand(text: str, env: dict[str, str]) -> str:
    return re.sub(
        r"\$\{([A-Z_]+)(?::-([^}]*))?\}|\$([A-Z_]+)",
        lambda m: env.get(m.group(1) or m.group(3), m.group(2) or ""),
        text,
    )


def without(flags: list[str], names: set[str] | dict[str, str]) -> tuple[list[str], list[str]]:
    """``flags`` without the flags ``names`` (and their values); the ones removed."""
    kept, removed, skip = [], [], False
    for token in flags:
        if skip and not token.startswith("--"):
            continue
        skip = token in names
        if skip:
            removed.append(token)
        else:
            kept.append(token)
    return kept, removed


def replace_value(flags: list[str], name: str, value: str) -> list[str]:
    out = list(flags)
    for i, token in enumerate(out[:-1]):
        if token == name:
            out[i + 1] = value
    return out


def math_rows(folder: Path, count: int = 8, start: int = 0, name: str = "dapo-math.jsonl") -> Path:
    """dapo-math-17k's layout (``prompt`` as chat messages, ``label``) on single-digit sums SmolLM2 can do."""
    path = folder / name
    rows = [
        {
            "prompt": [
                {"role": "user", "content": f"What is {a} + {a + 1}? Put your final answer in \\boxed{{}}."}
            ],
            "label": str(2 * a + 1),
        }
        for a in range(start, start + count)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    def __init__(
        self, name: str, slime: Path, model: Path, work: Path, rlsdk: list[str], engine: list[str]
    ) -> None:
        self.name, self.slime, self.model, self.work, self.rlsdk = name, slime, model, work, rlsdk
        self.engine = engine
        """The engine's flags: none (the embedded engine on this CPU), or rlsdk-launched SGLang's."""
        self.scale = GPU_SCALE if engine else CPU_SCALE
        self.changes: list[str] = []
        self.env = {
            "MODEL_DIR": str(model),
            "DATA_PATH": str(math_rows(work)),
            "SCRIPT_DIR": str(work / "examples"),
            "REPO_ROOT": str(work),
            "SLIME_DIR": str(work),
            "TEACHER_IP": "127.0.0.1",
        }

    def flags(self) -> tuple[list[str], str]:
        flags, driver = train_flags(script_text(self.slime, SCRIPTS[self.name]), self.env)
        flags, machine = without(flags, MACHINE_FLAGS)
        flags, dropped = without(flags, DROPPED)
        if machine:
            self.changes.append(f"GPU layout left out: {' '.join(sorted(set(machine)))}")
        for flag in sorted(set(dropped)):
            self.changes.append(f"{flag} left out: {DROPPED[flag]}")
        flags = replace_value(flags, "--hf-checkpoint", str(self.model))
        flags = replace_value(flags, "--prompt-data", self.env["DATA_PATH"])
        if "--eval-prompt-data" in flags:  # NAME PATH: the same sums, held out
            at = flags.index("--eval-prompt-data") + 2
            flags[at] = str(math_rows(self.work, count=4, start=20, name="eval.jsonl"))
            self.changes.append(f"--eval-prompt-data {flags[at - 1]}: 4 other sums in its place")
        where = "SGLang on one GPU" if self.engine else "the embedded engine on this CPU"
        self.changes.append(f"SmolLM2 and 8 dapo-style sums, {where}: " + " ".join(self.scale))
        return flags, driver

    def run(self, flags: list[str], after: tuple[str, ...] = ()) -> dict[str, Any]:
        """``rlsdk run --train``: the script's flags, the scale, then ``after`` (an example's own change)."""
        out = self.work / f"run-{self.name}"
        command = [
            *self.rlsdk,
            "run",
            "--train",
            *flags,
            *self.scale,
            *after,
            *self.engine,
            "--output",
            str(out),
            "--overwrite",
        ]
        path = os.pathsep.join(filter(None, [str(self.work), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        started = time.time()
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=self.work, timeout=1800)
        result: dict[str, Any] = {
            "seconds": round(time.time() - started, 1),
            "exit_code": done.returncode,
            "command": shlex.join(command[len(self.rlsdk) :]),
        }
        if done.returncode:
            result["error"] = done.stderr.strip().splitlines()[-1:] if done.stderr.strip() else []
            return result
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        result["steps"] = len(rows)
        result["last_step"] = {
            k: v
            for k, v in rows[-1].items()
            if isinstance(v, (int, float))
            and any(
                k.startswith(p)
                for p in (
                    "rollout/reward_mean",
                    "train/opd",
                    "train/mis",
                    "train/sync_delta",
                    "train/weights_checked",
                    "train/grad_norm",
                    "train/tis",
                    "eval/",
                )
            )
        }
        if (out / "eval.jsonl").exists():
            result["evals"] = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
        return result


def eval_multi_task(run: Run) -> dict[str, Any]:
    flags, _ = run.flags()
    config = script_text(run.slime, "examples/eval_multi_task/multi_task.yaml")
    aime = run.work / "aime.jsonl"
    aime.write_text(
        "".join(
            json.dumps(
                {"prompt": f"What is {a} * 3? Put your final answer in \\boxed{{}}.", "label": str(3 * a)}
            )
            + "\n"
            for a in range(1, 4)
        )
    )
    gpqa = run.work / "gpqa.jsonl"
    gpqa.write_text(
        "".join(
            json.dumps(
                {
                    "prompt": f"Which letter comes after {x}? Answer with the letter.",
                    "label": y,
                    "metadata": {"correct_letter": y},
                }
            )
            + "\n"
            for x, y in (("A", "B"), ("B", "C"))
        )
    )
    config = config.replace("/root/aime-2024/aime-2024.jsonl", str(aime)).replace(
        "/root/gpqa/gpqa_eval.jsonl", str(gpqa)
    )
    config = config[: config.index("    - name: ifbench")]
    if not run.engine:  # a CPU's scale: the defaults' 16384 tokens per answer would take hours
        config = config.replace("max_response_len: 16384", "max_response_len: 64")
        config = config.replace("n_samples_per_eval_prompt: 16", "n_samples_per_eval_prompt: 4")
        run.changes.append(
            "on a CPU: eval.defaults.max_response_len 64 (16384) and aime's 4 samples a prompt (16)"
        )
    (run.work / "multi_task.yaml").write_text(config)
    flags = replace_value(flags, "--eval-config", str(run.work / "multi_task.yaml"))
    run.changes.append(
        "the ifbench entry left out: rlsdk has no IFBench grader (slime clones allenai/IFBench and "
        "downloads NLTK data at import); aime and gpqa as the file gives them, on a few rows each"
    )
    run.changes.append("--eval-interval 1 (the script's 20 is past a 2-step run)")
    return run.run([*flags, "--eval-interval", "1"])


def fully_async(run: Run) -> dict[str, Any]:
    flags, driver = run.flags()
    assert driver == "train_async.py"
    run.changes.append("train_async.py -> rlsdk run --async")
    return run.run([*flags, "--async"])


def on_policy_distillation(run: Run) -> dict[str, Any]:
    port = free_port()
    run.env["TEACHER_PORT"] = str(port)
    flags, _ = run.flags()
    if run.engine:  # slime's own teacher: an SGLang server (of SmolLM2 here, not Qwen3-32B)
        python = run.engine[run.engine.index("--sglang-python") + 1]
        serve = [
            python,
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(run.model),
            "--port",
            str(port),
            "--mem-fraction-static",
            "0.15",
        ]
    else:
        serve = [*run.rlsdk, "serve", "--model", str(run.model), "--port", str(port)]
    run.changes.append(f"the teacher: {shlex.join(serve[-6:])} (slime's is SGLang serving Qwen3-32B)")
    teacher = subprocess.Popen(
        serve, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(1)
        return run.run(flags)
    finally:
        os.killpg(teacher.pid, signal.SIGTERM)
        teacher.wait(timeout=60)


def on_policy_distillation_megatron(run: Run) -> dict[str, Any]:
    flags, _ = run.flags()
    flags = replace_value(flags, "--opd-teacher-load", str(run.model))
    run.changes.append(
        "--opd-teacher-load: the teacher's Hugging Face folder (slime's is a torch_dist checkpoint)"
    )
    run.changes.append(
        "--on-invalid-reward score: the script gives no --label-key, so its math reward has no answer to "
        "compare with; slime scores every sample 0 there (the distillation term is the signal), rlsdk's "
        "rewards refuse a sample without a label (an invalid reward) unless told to score it"
    )
    return run.run([*flags, "--on-invalid-reward", "score"])


def delta_weight_sync(run: Run) -> dict[str, Any]:
    flags, _ = run.flags()
    flags = replace_value(flags, "--update-weight-disk-dir", str(run.work / "delta-shared"))
    flags = replace_value(flags, "--update-weight-local-checkpoint-dir", str(run.work / "delta-local"))
    run.changes.append("the delta folders are local ones (the script's are a shared and an NVMe mount)")
    flags = replace_value(flags, "--rm-type", "math")
    run.changes.append(
        "--rm-type deepscaler -> math (rlsdk's grader: the final answer, boxed or not) and 64-token answers: "
        "deepscaler pays only after </think>, which SmolLM2 never writes, so no sample would earn a reward, no "
        "weight would change and every delta would be empty"
    )
    return run.run([*flags, "--weights-check", "on"], after=("--rollout-max-response-len", "64"))


def train_infer_mismatch_helper(run: Run) -> dict[str, Any]:
    flags, _ = run.flags()
    flags = replace_value(
        flags, "--custom-config-path", str(run.work / "examples/train_infer_mismatch_helper/mis.yaml")
    )
    return run.run(flags)


def geo3k_vlm(run: Run) -> dict[str, Any]:
    return {
        "exit_code": None,
        "cannot_run": "rlsdk has no VLM trainer path: the torch and megatron trainers take "
        "token ids only (no pixel_values / image_grid_thw per sample, no vision tower in the forward pass), "
        "and the embedded engine takes no images; the data side is there (--multimodal-keys puts a row's "
        "images at its <image> placeholders, the sglang engine sends them as image_data)",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("slime", type=Path, help="a clone (or bare mirror) of THUDM/slime")
    parser.add_argument("--examples", nargs="*", default=list(SCRIPTS))
    parser.add_argument(
        "--model", type=Path, default=None, help="default: the embedded engine's SmolLM2 folder"
    )
    parser.add_argument("--gpu", action="store_true", help="SGLang on one GPU (needs --sglang-python)")
    parser.add_argument("--sglang-python", default=None, help="the Python with SGLang installed")
    opts = parser.parse_args()
    engine = (
        ["--engine", "sglang", "--sglang-python", opts.sglang_python or sys.executable] if opts.gpu else []
    )
    if opts.model is None:
        from rlsdk_embedded.model_files import default_model_path

        opts.model = default_model_path()
    rlsdk = [sys.executable, "-m", "rlsdk_cli.app"]
    commit = (
        subprocess.run(
            ["git", "-C", str(opts.slime), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        or "a folder of slime's files"
    )
    for name in opts.examples:
        with tempfile.TemporaryDirectory(prefix=f"slime-{name}-") as folder:
            work = Path(folder)
            if (opts.slime / ".git").exists() or (opts.slime / "HEAD").exists():  # a clone or a bare mirror
                archive = subprocess.run(
                    ["git", "-C", str(opts.slime), "archive", "HEAD", "examples"],
                    capture_output=True,
                    check=True,
                ).stdout
                subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
            else:
                shutil.copytree(opts.slime / "examples", work / "examples")
            run = Run(name, opts.slime, opts.model, work, rlsdk, engine)
            result = globals()[name](run)
            print(
                json.dumps(
                    {
                        "example": name,
                        "slime": commit,
                        "status": status(result),
                        "changes": run.changes,
                        **result,
                    }
                ),
                flush=True,
            )
            shutil.rmtree(work, ignore_errors=True)


def status(result: dict[str, Any]) -> str:
    if result.get("cannot_run"):
        return "cannot run"
    return "ran" if result.get("exit_code") == 0 else "failed"


if __name__ == "__main__":
    main()
