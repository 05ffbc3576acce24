"""The megatron trainer on two GPUs, tensor parallel (TP=2), data parallel (DP=2) and pipeline parallel
(PP=2: half the layers a GPU, megatron-core's 1F1B schedule, activations sent over NCCL), against one GPU
(TP=1) (not run in CI; one device call on two GPUs, a few minutes; the last line printed is one JSON
object). With ``--shape`` a published shape's random weights instead of the bench model's (``workload.SHAPES``);
for a MoE shape (``qwen3-moe-32e``: 32 experts, 8 active) expert parallel (EP=2: 16 experts a GPU, tokens
all-to-all over NCCL; ``ep4``: EP=4 on four GPUs, 8 experts a GPU), DP=2, PP=2 and TP=2 (with sequence
parallelism, experts whole on each GPU) against one GPU. ``--configs`` picks some of them (the one-GPU
reference always runs).

Each configuration is built as ``rlsdk run --trainer megatron`` builds it: this process is rank 0 and
starts the other ranks itself (their logs under ``<work>/logs-<config>/``). All load the same Hugging Face folder
(random bf16 weights of the bench model, or ``--checkpoint``) and get the same batch (megatron_parity.py's:
``--samples`` samples in groups of 4, random tokens, random +-1 rewards). In float32, where a parallel
configuration must compute the one-GPU function to rounding, per configuration against TP=1:

- per-token log-probs of every response token before training (``logprob_pass``: mean <=
  ``--logprob-mean-tol``, max <= ``--logprob-max-tol`` nats);
- the first train step's ``sft_loss`` (``loss_pass``: relative difference <= 1%) and grad norm;
- the Hugging Face weights after that step: ``update_rel_gap``, the norm of (parallel - one GPU) over the
  norm of the one-GPU update (``weights_pass``: <= ``--update-tol``; Adam divides each gradient by its
  own size, so elements with next to no gradient may move differently by rounding alone).

Then tokens/s of ``--steps`` bfloat16 train steps per configuration (median, after a warm-up step).

    PYTHONPATH=/tmp/rl:benchmarks/gpu python3 benchmarks/gpu/megatron_parallel.py --model-config .gpu/bench-model
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from megatron_parity import batch, gaps, model_parser, rounded, weights_folder
from workload import SHAPES, machine, run_reporting, shape_checkpoint

from rlsdk import RolloutConfig

DENSE = {
    "tp1": {},
    "tp2": {"tensor_model_parallel_size": 2},
    "dp2": {"actor_num_gpus_per_node": 2},
    "pp2": {"pipeline_model_parallel_size": 2},
}
MOE = {
    "ep1": {},
    "ep2": {"expert_model_parallel_size": 2},
    "ep4": {"expert_model_parallel_size": 4},
    "dp2": {"actor_num_gpus_per_node": 2},
    "pp2": {"pipeline_model_parallel_size": 2},
    "tp2": {"tensor_model_parallel_size": 2},
}
CONFIGS = {**DENSE, **MOE}


def build(folder: Path, work: Path, name: str, dtype: str, opts: argparse.Namespace) -> Any:
    from rlsdk_megatron.plugin import megatron_trainer

    args = RolloutConfig(
        hf_checkpoint=str(folder),
        train=True,
        trainer="megatron",
        lr=1e-5,
        micro_batch_size=opts.micro_batch_size,
        train_dtype=dtype,
        rollout_temperature=1.0,
        loss_type="sft_loss",
        output_dir=str(work / f"out-{name}-{dtype}"),
        **CONFIGS[name],
    )
    return megatron_trainer(args)


def close(trainer: Any) -> None:
    """Stop a configuration's ranks and leave no process group behind for the next one."""
    import torch.distributed as dist

    trainer.close()
    if dist.is_initialized():  # one GPU: the trainer's own one-process group
        dist.destroy_process_group()


def free_gpu_memory() -> None:
    import torch

    gc.collect()
    torch.cuda.empty_cache()


def update_gap(parallel: dict[str, Any], single: dict[str, Any], start: dict[str, Any]) -> float:
    """||parallel - single|| / ||single - start|| over every weight (float32, on the CPU)."""
    diff = sum(float((parallel[k].float() - single[k].float()).square().sum()) for k in single)
    update = sum(float((single[k].float() - start[k].float()).square().sum()) for k in single)
    return (diff / max(update, 1e-30)) ** 0.5


def main() -> None:
    parser = model_parser(__doc__, micro_batch=4)
    parser.add_argument(
        "--steps", type=int, default=3, help="bfloat16 steps timed per configuration (0: none)"
    )
    parser.add_argument("--update-tol", type=float, default=0.05)
    parser.add_argument("--shape", choices=sorted(SHAPES), help="a published shape instead of --model-config")
    parser.add_argument(
        "--configs", help="comma-separated parallel configurations to compare (default: all; e.g. pp2)"
    )
    opts = parser.parse_args()
    moe = bool(opts.shape and SHAPES[opts.shape]["model_type"] == "qwen3_moe")
    every = MOE if moe else DENSE
    reference = next(iter(every))
    chosen = opts.configs.split(",") if opts.configs else list(every)
    unknown = [name for name in chosen if name not in every]
    if unknown:
        parser.error(f"--configs: {unknown} are not among {sorted(every)}")
    configs = [reference, *(name for name in chosen if name != reference)]
    others = configs[1:]

    import torch

    from rlsdk_megatron.trainer import read_hf_weights

    work = Path(tempfile.mkdtemp(prefix="megatron-parallel-"))
    if opts.shape and not opts.checkpoint:
        overrides = {"initializer_range": opts.init_range}
        folder = shape_checkpoint(
            opts.shape, opts.model_config, work / "w", device="cuda", overrides=overrides
        )
    else:
        folder = weights_folder(opts, work)
    config = json.loads((folder / "config.json").read_text())
    groups = batch(opts.samples, opts.prompt_len, opts.response_len, config["vocab_size"])
    samples = [s for g in groups for s in g]
    start = read_hf_weights(folder)

    exact: dict[str, dict[str, Any]] = {}
    for name in configs:
        trainer = build(folder, work, name, "float32", opts)
        log_probs = trainer.response_log_probs(samples)
        metrics = trainer.train_step(0, groups)
        weights = {k: v.detach().float().cpu() for k, v in trainer.weights().items()}
        exact[name] = {"log_probs": log_probs, "metrics": metrics, "weights": weights}
        close(trainer)
        del trainer
        free_gpu_memory()

    single = exact[reference]
    results: dict[str, Any] = {}
    for name in others:
        run = exact[name]
        max_gap, mean_gap = gaps(run["log_probs"], single["log_probs"])
        loss, reference_loss = run["metrics"]["train/loss"], single["metrics"]["train/loss"]
        loss_gap = abs(loss - reference_loss) / max(abs(reference_loss), 1e-8)
        gap = update_gap(run["weights"], single["weights"], start)
        results[name] = {
            **{f"logprob_{k}": v for k, v in rounded((max_gap, mean_gap)).items()},
            "logprob_pass": mean_gap <= opts.logprob_mean_tol and max_gap <= opts.logprob_max_tol,
            "loss": loss,
            "loss_rel_diff": round(loss_gap, 6),
            "loss_pass": loss_gap <= 0.01,
            "grad_norm": run["metrics"]["train/grad_norm"],
            "update_rel_gap": round(gap, 5),
            "weights_pass": run["weights"].keys() == single["weights"].keys() and gap <= opts.update_tol,
        }
    results[reference] = {
        "loss": single["metrics"]["train/loss"],
        "grad_norm": single["metrics"]["train/grad_norm"],
    }
    del exact

    for name in configs if opts.steps else ():
        trainer = build(folder, work, name, "bfloat16", opts)
        rates = [
            round(trainer.train_step(step, groups)["train/tokens_per_s"], 1) for step in range(opts.steps + 1)
        ][1:]  # the first step warms up
        results[name]["tokens_per_s_median"] = statistics.median(rates)
        results[name]["tokens_per_s"] = rates
        results[name]["peak_memory_gb_rank0"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)
        torch.cuda.reset_peak_memory_stats()
        close(trainer)
        del trainer
        free_gpu_memory()

    report = {
        "benchmark": "megatron_parallel",
        "inputs": {
            **vars(opts),
            "checkpoint": str(folder),
            "loss_type": "sft_loss",
            "comparison_dtype": "float32",
            "speed_dtype": "bfloat16",
            "weights": "given" if opts.checkpoint else "random bf16 (bench model config)",
        },
        **results,
        "pass": all(results[n][k] for n in others for k in ("logprob_pass", "loss_pass", "weights_pass")),
        "machine": machine(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    run_reporting(main, "megatron_parallel")
