"""The trust check on one GPU (issue 45; not run in CI; one device call of about 5 minutes; the last line
printed is one JSON object). SmolLM2-135M-Instruct's real weights, SGLang launched by rlsdk and colocated
with the torch trainer (float32 weights, as ``learning_gpu.py`` trains), CUDA-IPC syncs:

1. **checksums**: tensors made from a fixed 32-bit LCG (float32, bfloat16, float16; one word to three
   tiles) hashed by SGLang's own ``gpu_tensor_hash`` (in SGLang's interpreter) and by rlsdk's
   ``tensor_checksum`` on the GPU and the CPU; written to ``--output/sglang-0.5.17-checksums.json``, the
   fixture ``tests/test_weight_checksums.py`` holds rlsdk to;
2. **before any training**: the weights check against SGLang's ``/weights_checker`` (every tensor of the
   model, fused as SGLang holds them), and the log-prob noise baseline over ``--probe-sets`` disjoint sets
   of 8 probes and of 4 (its spread: the drift check's threshold moves with it);
3. **one tensor a sync got wrong**, at each position (the embeddings, the first layer's ``v_proj``, a
   middle layer's ``up_proj``, the last layer's ``down_proj``, the final norm), two ways (``--faults``):
   sent with its values from before the step (``stale``: the fault the log-prob checks miss), or not sent
   (``omit``: with SGLang's weights memory released for the train step, what it holds then is not the old
   tensor). A real train step (random +-1 rewards over SGLang's samples of the shipped two-digit
   arithmetic prompts, chat template), the faulty sync, then the weights check (must name it) beside what
   the log-prob checks saw (largest gap against the 2.0 tolerance, mean gap as a multiple of the noise
   against the drift check's 4x); then a full sync, which must pass;
4. **correct syncs**: ``--correct-steps`` more train steps and full syncs, each checked (0 false alarms),
   with the check's seconds.

    PYTHONPATH=/tmp/rl:benchmarks/gpu python3 benchmarks/gpu/trust_gpu.py \\
        --gguf /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf --sglang-python /tmp/sglang-python --output $OUT

On a CPU, ``--engine embedded --model FOLDER --skip-fixture --samples 2 --prompts 8`` checks the script (in-process
syncs, float32 on both sides).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from learning_gpu import model_folder, shipped
from workload import machine, run_reporting, sample_groups

from rlsdk import RolloutConfig, Sample
from rlsdk.engines.weight_checksums import tensor_checksum
from rlsdk.training.sync import WeightSyncError, check_tolerance, choose_sync
from rlsdk.training.trust import DriftCheck, check_weights

POSITIONS = {
    "embeddings": "model.embed_tokens.weight",
    "first_layer": "model.layers.0.self_attn.v_proj.weight",
    "middle_layer": "model.layers.{middle}.mlp.up_proj.weight",
    "last_layer": "model.layers.{last}.mlp.down_proj.weight",
    "final_norm": "model.norm.weight",
}
FIXTURE_CASES = [  # (words, dtype): one word, padding, one tile, three tiles with a short last one
    (1, "float32"),
    (3, "bfloat16"),
    (8192, "float16"),
    (2 * 8192 + 77, "bfloat16"),
    (3 * 8192 + 5, "float32"),
]
SGLANG_HASH = """
import json, sys, torch
from sglang.kernels.ops.memory.gpu_tensor_hash import gpu_tensor_hash
out = []
for words, dtype in json.loads(sys.argv[1]):
    raw = torch.tensor([(i * 2654435761 + 12345) % 2**32 for i in range(words)], dtype=torch.int64)
    tensor = raw.to(torch.int32).view(getattr(torch, dtype)).cuda()
    out.append(f"{gpu_tensor_hash(tensor):016x}")
print(json.dumps(out))
"""


def lcg_tensor(words: int, dtype: str) -> Any:
    """``words`` 32-bit words of a fixed LCG, viewed as ``dtype`` (the same bytes as ``SGLANG_HASH``'s)."""
    import torch

    raw = torch.tensor([(i * 2654435761 + 12345) % 2**32 for i in range(words)], dtype=torch.int64)
    return raw.to(torch.int32).view(getattr(torch, dtype))


def checksum_fixture(opts: argparse.Namespace) -> dict[str, Any]:
    """SGLang's checksums of the LCG tensors against rlsdk's (GPU and CPU); the fixture file."""
    done = subprocess.run(
        [opts.sglang_python, "-c", SGLANG_HASH, json.dumps(FIXTURE_CASES)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/tmp",
    )
    if done.returncode:
        return {"error": done.stderr[-1500:]}
    sglang = json.loads(done.stdout.strip().splitlines()[-1])
    cases = []
    for (words, dtype), theirs in zip(FIXTURE_CASES, sglang, strict=True):
        tensor = lcg_tensor(words, dtype)
        ours_gpu, ours_cpu = tensor_checksum(tensor.cuda()), tensor_checksum(tensor)
        cases.append(
            {"words": words, "dtype": dtype, "sglang": theirs, "rlsdk_gpu": ours_gpu, "rlsdk_cpu": ours_cpu}
        )
    fixture = {
        "what": "SGLang 0.5.17's gpu_tensor_hash of tensors of 32-bit words (i * 2654435761 + 12345) % 2**32 "
        "viewed as dtype (benchmarks/gpu/trust_gpu.py)",
        "machine": machine().get("card"),
        "cases": [{k: c[k] for k in ("words", "dtype", "sglang")} for c in cases],
    }
    (opts.output / "sglang-0.5.17-checksums.json").write_text(json.dumps(fixture, indent=1) + "\n")
    return {"cases": cases, "all_equal": all(c["sglang"] == c["rlsdk_gpu"] == c["rlsdk_cpu"] for c in cases)}


def prompt_ids(tokenizer: Any, count: int) -> list[list[int]]:
    """The shipped two-digit arithmetic prompts with the model's chat template, as a run applies it."""
    rows = [json.loads(line) for line in shipped("arithmetic2-train.jsonl").read_text().splitlines()[:count]]
    texts = [
        tokenizer.apply_chat_template(row["input"], add_generation_prompt=True, tokenize=False)
        for row in rows
    ]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


@contextlib.contextmanager
def leaving_out(trainer: Any, name: str | None, fault: str) -> Iterator[dict[str, Any]]:
    """Within: the trainer's exported weights (``weights``, ``weight_buckets``) as a faulty sync sends them:
    ``stale``, ``name`` (and the names tied to it) with its values from before; ``omit``, without it (an
    in-process engine, which needs every name, gets the old values). The trained parameters are untouched.
    Yields the old values by name (none without ``name``)."""
    if name is None:
        yield {}
        return
    state = trainer.model.state_dict()
    tied = {n for n, t in state.items() if t.data_ptr() == state[name].data_ptr()}
    weights, buckets = trainer.weights, trainer.weight_buckets
    old = {n: state[n].detach().clone() for n in tied}

    def sent(bucket: dict[str, Any]) -> dict[str, Any]:
        if fault == "stale":
            return {k: old.get(k, v) for k, v in bucket.items()}
        return {k: v for k, v in bucket.items() if k not in tied}

    trainer.weights = lambda: {**weights(), **old}
    trainer.weight_buckets = lambda size: (sent(b) for b in buckets(size))
    try:
        yield old
    finally:
        del trainer.weights, trainer.weight_buckets


def visible_changes(trainer: Any, old: dict[str, Any], dtype: Any) -> int:
    """Elements of the tensors in ``old`` whose trained value differs from the old one once cast to the
    engine's ``dtype``: a stale tensor with none holds exactly what a correct sync would have sent, so no
    check can see it (one Adam step of 1e-5 on SmolLM2's final norm, values near 1.8, changes none of its 576
    elements in bfloat16, whose spacing there is 0.0078)."""
    state = trainer.model.state_dict()
    return sum(int((state[n].detach().to(dtype) != v.to(dtype)).sum()) for n, v in old.items())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--engine", default="sglang", help="sglang (launched, colocated) or embedded (a CPU check)"
    )
    parser.add_argument("--model", help="a Hugging Face folder of SmolLM2-135M-Instruct")
    parser.add_argument("--gguf", help="SmolLM2-135M-Instruct.Q4_1.gguf, converted once into --cache-dir")
    parser.add_argument("--cache-dir", default="/tmp/rlsdk-models")
    parser.add_argument("--sglang-python", default="/tmp/sglang-python")
    parser.add_argument("--output", type=Path, default=Path(tempfile.mkdtemp(prefix="trust-gpu-")))
    parser.add_argument("--prompts", type=int, default=40, help="at least 8 x --probe-sets")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--probe-sets", type=int, default=5)
    parser.add_argument("--correct-steps", type=int, default=5)
    parser.add_argument("--skip-fixture", action="store_true", help="no SGLang interpreter (a CPU check)")
    parser.add_argument(
        "--faults",
        nargs="+",
        default=["stale", "omit"],
        choices=["stale", "omit"],
        help="stale: the tensor sent with its old values (a sync that skipped it); omit: not sent at all",
    )
    opts = parser.parse_args()
    opts.output.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"benchmark": "trust_gpu", "machine": machine()}
    if not opts.skip_fixture:
        report["checksums"] = checksum_fixture(opts)
        print(json.dumps({**report, "partial": "checksums only"}), flush=True)
    report.update(trust(opts))
    print(json.dumps(report))


def trust(opts: argparse.Namespace) -> dict[str, Any]:
    import torch

    from rlsdk.engines.launch.sglang import SGLangLauncher, plan_launch
    from rlsdk.engines.sglang_client import SGLangClient
    from rlsdk.runtime import BackgroundLoop
    from rlsdk.training.torch_trainer import TorchTrainer

    model = model_folder(opts)
    work = Path(tempfile.mkdtemp(prefix="trust-gpu-"))
    gpu = opts.engine == "sglang"
    args = RolloutConfig(
        hf_checkpoint=str(model),
        train=True,
        colocate=gpu,
        weight_sync="tensor" if gpu else "auto",
        sglang_python=opts.sglang_python,
        sglang_mem_fraction_static=0.4,
        sglang_dtype="bfloat16",
        train_dtype="float32",
        lr=opts.lr,
        micro_batch_size=32,
        weights_check="on",
    )
    # what the engine holds: SGLang its --dtype, the embedded engine float32
    engine_dtype = getattr(torch, args.sglang_dtype) if gpu else torch.float32
    loop = BackgroundLoop()
    if gpu:
        launcher = SGLangLauncher(plan_launch(args, str(model)), work / "logs", 600)
        engine: Any = SGLangClient(launcher.url, launcher=launcher)
    else:
        from rlsdk_embedded.engine import EmbeddedEngine

        engine = EmbeddedEngine(str(model), threads=2)
    started = time.perf_counter()
    loop.run(engine.start())
    out: dict[str, Any] = {"engine_startup_seconds": round(time.perf_counter() - started, 1)}
    try:
        trainer = TorchTrainer(args)
        layers = trainer.model.config.num_hidden_layers
        positions = {k: v.format(middle=layers // 2, last=layers - 1) for k, v in POSITIONS.items()}
        strategy = choose_sync(args, engine, work / "disk-sync")
        groups = loop.run(
            sample_groups(engine, prompt_ids(trainer.tokenizer, opts.prompts), opts.samples, opts.new_tokens)
        )
        version = 0

        def weights_check() -> dict[str, Any]:
            t0 = time.perf_counter()
            try:
                verdict = loop.run(check_weights(engine, trainer, version))
            except WeightSyncError as exc:
                return {
                    "caught": True,
                    "error": str(exc)[:600],
                    "seconds": round(time.perf_counter() - t0, 3),
                }
            return {
                "caught": False,
                "complete": verdict.complete,
                "tensors": verdict.tensors,
                "unverified": verdict.unverified[:10],
                "unavailable": verdict.unavailable,
                "seconds": round(time.perf_counter() - t0, 3),
            }

        def drift(probes: list[Sample]) -> float:
            return max(loop.run(DriftCheck().measure(engine, trainer, probes)))

        firsts = [group[0] for group in groups]  # disjoint probe sets, one sample per group
        out["before_training"] = weights_check()
        noise = {
            size: [drift(firsts[i * size : (i + 1) * size]) for i in range(opts.probe_sets)]
            for size in (8, 4)
        }
        for size, values in noise.items():
            out[f"noise_{size}_probes"] = [float(f"{n:.4g}") for n in values]
            out[f"noise_spread_{size}"] = round(max(values) / max(min(values), 1e-12), 2)
        baseline = max(noise[8][0], 1e-12)  # the drift check's, as a run measures it: 8 probes
        probes, tolerance = firsts[:8], check_tolerance(args, trainer)

        def step(skip: str | None, fault: str = "omit") -> dict[str, Any]:
            nonlocal version
            loop.run(strategy.before_train(engine))
            with leaving_out(trainer, skip, fault) as old:  # the old values, taken before the step
                trainer.train_step(version, groups)
                changed = visible_changes(trainer, old, engine_dtype)
                version += 1
                t0 = time.perf_counter()
                loop.run(strategy.push(engine, trainer, str(version)))
                synced = time.perf_counter() - t0
            mean = drift(probes)
            from rlsdk.training.sync import engine_log_probs

            served = loop.run(engine_log_probs(engine, probes[0]))
            expected = trainer.response_log_probs([probes[0]])[0]
            return {
                "sync_seconds": round(synced, 4),
                "elements_changed_in_engine_dtype": changed,
                "weights": weights_check(),
                "logprob_max_gap": round(max(abs(a - b) for a, b in zip(served, expected, strict=True)), 4),
                "logprob_max_gap_over_tolerance": max(
                    abs(a - b) for a, b in zip(served, expected, strict=True)
                )
                > tolerance,
                "mean_gap_x_noise": round(mean / baseline, 2),
                "drift_check_would_fire": mean > 4 * baseline,
            }

        skipped = {}
        for fault in opts.faults:
            for position, name in positions.items():
                skipped[f"{fault}:{position}"] = {"tensor": name, **step(name, fault)}
                skipped[f"{fault}:{position}"]["after_full_sync"] = step(None)["weights"]
                if gpu:
                    torch.cuda.empty_cache()
        out["skipped_tensor"] = skipped
        out["correct_syncs"] = [step(None) for _ in range(opts.correct_steps)]
        out["caught_at_first_sync"] = {p: s["weights"]["caught"] for p, s in skipped.items()}
        # a stale tensor the step did not change in the engine's dtype is the same bytes as a correct sync's
        visible = {
            p: s["weights"]["caught"]
            for p, s in skipped.items()
            if p.startswith("omit:") or s["elements_changed_in_engine_dtype"]
        }
        out["not_visible_in_engine_dtype"] = sorted(set(skipped) - set(visible))
        out["log_prob_checks_caught"] = {
            p: s["logprob_max_gap_over_tolerance"] or s["drift_check_would_fire"] for p, s in skipped.items()
        }
        checks = [out["before_training"], *(s["after_full_sync"] for s in skipped.values())]
        checks += [s["weights"] for s in out["correct_syncs"]]
        out["false_alarms"] = sum(c["caught"] for c in checks)
        out["checks_of_correct_syncs"] = len(checks)
        out["weights_check_seconds_median"] = statistics.median(c["seconds"] for c in checks)
        out["passed"] = (
            all(visible.values()) and out["false_alarms"] == 0 and all(c.get("complete") for c in checks)
        )
    finally:
        loop.run(engine.close())
    return out


if __name__ == "__main__":
    run_reporting(main, "trust_gpu")
