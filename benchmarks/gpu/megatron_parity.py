"""The megatron trainer against the torch trainer on one GPU (not run in CI; one device call, about two
minutes; the last line printed is one JSON object).

Both trainers load the same Hugging Face folder (random bf16 weights of the bench model, or
``--checkpoint``) and get the same batch: ``--samples`` samples in groups of 4, prompts of
``--prompt-len`` and responses of ``--response-len`` random tokens, random +-1 rewards.

Whether the two compute the same function is checked in float32, where both must agree to rounding
(on CPU, at this config with 24 layers, the converted megatron model and transformers agree within 5e-5
nats; in bfloat16 they differ by 0.1 nats on average, as transformers' bfloat16 differs from its own
float32), so a gap means a wrong function, not rounding. Reported, in float32:

- each trainer's per-token log-probs against one plain causal forward per sample of the Hugging Face
  model (``logprob_vs_plain_forward``: which side is off, if one is);
- per-token log-probs of every response token before training: max and mean |megatron - torch|
  (``logprob_pass``: mean <= ``--logprob-mean-tol`` and max <= ``--logprob-max-tol`` nats), beside the
  spread of the log-probs themselves;
- the first train step's loss (same weights, same batch): relative difference (``loss_pass``: <= 1%). The
  loss is ``sft_loss`` (the responses' negative log-likelihood): a first policy-gradient step has ratio 1
  and group-centred advantages, so its loss is 0 whatever the model computes;
- after that step the megatron weights, converted to Hugging Face format, loaded into the torch trainer's
  model give the megatron trainer's log-probs (``sync_pass``: the conversion every sync relies on).

Then in bfloat16 (how both train): per-token gaps, megatron vs torch and each against its float32 self
(the rounding's own size), and tokens/s of ``--steps`` train steps each (median; target megatron >= torch).

    PYTHONPATH=/tmp/rl:benchmarks/gpu python3 benchmarks/gpu/megatron_parity.py --model-config .gpu/bench-model
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import tempfile
from pathlib import Path
from typing import Any

from workload import machine, random_checkpoint, run_reporting

from rlsdk import RolloutConfig, Sample


def batch(samples: int, prompt_len: int, response_len: int, vocab: int) -> list[list[Sample]]:
    rng = random.Random(0)
    groups = []
    for g in range(samples // 4):
        prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
        groups.append(
            [
                Sample(
                    group_index=g,
                    index=i,
                    tokens=prompt + [rng.randrange(vocab) for _ in range(response_len)],
                    response_length=response_len,
                    reward=rng.choice([-1.0, 1.0]),
                    status=Sample.Status.COMPLETED,
                )
                for i in range(4)
            ]
        )
    return groups


def gaps(a: list[list[float]], b: list[list[float]]) -> tuple[float, float]:
    flat = [abs(x - y) for row_a, row_b in zip(a, b, strict=True) for x, y in zip(row_a, row_b, strict=True)]
    return max(flat), sum(flat) / len(flat)


def plain_log_probs(model: Any, samples: list[Sample]) -> list[list[float]]:
    """A reference neither trainer's batching touches: one plain causal forward of a Hugging Face model per
    sample, the log-prob of each response token under the logits of the position before it."""
    import torch

    out = []
    with torch.no_grad():
        for sample in samples:
            tokens = torch.tensor(sample.tokens, device=model.device)
            logits = model(input_ids=tokens[None]).logits[0, sample.prompt_length - 1 : -1].float()
            out.append(logits.log_softmax(-1).gather(-1, tokens[sample.prompt_length :, None])[:, 0].tolist())
    return out


def rounded(gap: tuple[float, float]) -> dict[str, float]:
    return {"max_abs_diff": round(gap[0], 5), "mean_abs_diff": round(gap[1], 6)}


def model_parser(doc: str | None, micro_batch: int) -> argparse.ArgumentParser:
    """The options of both megatron scripts (this one and megatron_parallel.py): the model and its
    weights, the batch (``micro_batch`` samples a micro-batch by default), the float32 tolerances."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--micro-batch-size", type=int, default=micro_batch)
    parser.add_argument("--model-config", default=".gpu/bench-model")
    parser.add_argument("--checkpoint", help="A Hugging Face folder with weights (default: random weights)")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--response-len", type=int, default=256)
    parser.add_argument(
        "--init-range",
        type=float,
        default=0.05,
        help="std of the random weights (the config's 0.02 leaves attention nearly uniform, "
        "where a wrong head layout would hardly show)",
    )
    parser.add_argument("--logprob-mean-tol", type=float, default=1e-3, help="float32, nats")
    parser.add_argument("--logprob-max-tol", type=float, default=1e-2, help="float32, nats")
    return parser


def weights_folder(opts: argparse.Namespace, work: Path) -> Path:
    """``--checkpoint``, or random bf16 weights of ``--model-config`` (std ``--init-range``) in ``work/w``."""
    if opts.checkpoint:
        return Path(opts.checkpoint)
    return random_checkpoint(
        opts.model_config, work / "w", device="cuda", overrides={"initializer_range": opts.init_range}
    )


def main() -> None:
    parser = model_parser(__doc__, micro_batch=8)
    parser.add_argument(
        "--steps", type=int, default=8, help="measured train steps per trainer after one warm-up (at least 5)"
    )
    opts = parser.parse_args()
    if opts.steps < 5:
        parser.error("--steps: a speed ratio needs at least 5 measured steps (three varied 1.07x-1.55x)")

    import torch

    from rlsdk.training.torch_trainer import TorchTrainer
    from rlsdk_megatron.trainer import MegatronTrainer

    work = Path(tempfile.mkdtemp(prefix="megatron-parity-"))
    folder = weights_folder(opts, work)

    def trainers(dtype: str) -> dict[str, Any]:
        args = RolloutConfig(
            hf_checkpoint=str(folder),
            train=True,
            lr=1e-5,
            micro_batch_size=opts.micro_batch_size,
            train_device="cuda",
            train_dtype=dtype,
            rollout_temperature=1.0,
            loss_type="sft_loss",
        )
        return {"torch": TorchTrainer(args), "megatron": MegatronTrainer(args)}

    config = json.loads((folder / "config.json").read_text())
    groups = batch(opts.samples, opts.prompt_len, opts.response_len, config["vocab_size"])
    samples = [s for g in groups for s in g]

    exact = trainers("float32")
    log_probs = {name: t.response_log_probs(samples) for name, t in exact.items()}
    max_gap, mean_gap = gaps(log_probs["megatron"], log_probs["torch"])
    plain = plain_log_probs(exact["torch"].model, samples)
    vs_plain = {name: rounded(gaps(lp, plain)) for name, lp in log_probs.items()}
    first = {name: t.train_step(0, groups) for name, t in exact.items()}
    loss = {name: m["train/loss"] for name, m in first.items()}
    loss_gap = abs(loss["megatron"] - loss["torch"]) / max(abs(loss["torch"]), 1e-8)
    # The trained megatron weights in Hugging Face format, as every sync hands them to an engine.
    megatron, reference = exact["megatron"], exact["torch"]
    missing, unexpected = reference.model.load_state_dict(dict(megatron.weights()), strict=False)
    sync_max, sync_mean = gaps(reference.response_log_probs(samples), megatron.response_log_probs(samples))
    del exact, megatron, reference
    gc.collect()
    torch.cuda.empty_cache()

    fast = trainers("bfloat16")
    bf16_log_probs = {name: t.response_log_probs(samples) for name, t in fast.items()}
    bf16_gaps = {
        "megatron_vs_torch": gaps(bf16_log_probs["megatron"], bf16_log_probs["torch"]),
        "torch_vs_float32_torch": gaps(bf16_log_probs["torch"], log_probs["torch"]),
        "megatron_vs_float32_megatron": gaps(bf16_log_probs["megatron"], log_probs["megatron"]),
    }
    speed: dict[str, Any] = {}
    for name, trainer in fast.items():
        rates = [
            round(trainer.train_step(step, groups)["train/tokens_per_s"], 1) for step in range(opts.steps + 1)
        ][1:]  # the first step warms up
        speed[name] = {"tokens_per_s_median": statistics.median(rates), "tokens_per_s": rates}
    speed["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)

    report = {
        "benchmark": "megatron_parity",
        "inputs": {
            **vars(opts),
            "checkpoint": str(folder),
            "loss_type": "sft_loss",
            "comparison_dtype": "float32",
            "weights": "given" if opts.checkpoint else "random bf16 (bench model config)",
        },
        "logprob_max_abs_diff": round(max_gap, 5),
        "logprob_mean_abs_diff": round(mean_gap, 6),
        "logprob_pass": mean_gap <= opts.logprob_mean_tol and max_gap <= opts.logprob_max_tol,
        "logprob_std_torch": round(statistics.pstdev(x for row in log_probs["torch"] for x in row), 4),
        "logprob_vs_plain_forward": vs_plain,
        "bfloat16_logprob_gaps": {name: rounded(gap) for name, gap in bf16_gaps.items()},
        "loss": loss,
        "loss_rel_diff": round(loss_gap, 5),
        "loss_pass": loss_gap <= 0.01,
        "converted_weights": {
            "missing": missing[:5],
            "unexpected": unexpected[:5],
            "logprob_max_abs_diff": round(sync_max, 5),
            "logprob_mean_abs_diff": round(sync_mean, 6),
        },
        "sync_pass": not missing and not unexpected and sync_mean <= opts.logprob_mean_tol,
        "speed": speed,
        "speed_ratio": round(
            speed["megatron"]["tokens_per_s_median"] / speed["torch"]["tokens_per_s_median"], 3
        ),
        "machine": machine(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    run_reporting(main, "megatron_parity")
