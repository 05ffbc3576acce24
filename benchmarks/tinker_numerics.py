"""The tinker-cookbook's own sampler-versus-trainer check against ``rlsdk tinker serve``: after a few
cross-entropy steps (the cookbook's supervised datums, its renderer), sequences sampled from the trained
weights are scored again by the training client, and the cookbook's ``compute_kl_sample_train`` (the
``optim/kl_sample_train_v1``/``_v2`` of its RL loop) compares the two; the largest per-token gap must be
within rlsdk's trust-check tolerance (0.05 nats on the CPU in float32, 2 on CUDA in bfloat16).

Runs in the cookbook's environment (scripts/tinker_cookbook_env.sh), against a running server:

    TINKER_API_KEY=... .venv-cookbook/bin/python benchmarks/tinker_numerics.py --base-url URL \\
        [--model-name NAME] [--steps 4] [--samples 8] [--max-tokens 24] [--tolerance 0.05]

Prints one JSON object (the last line) and exits 1 when the gap is over the tolerance.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from harness import machine

QUESTIONS = [(a, b) for a in range(1, 5) for b in range(1, 5)]
SUFFIX = " Provide a numerical answer without units, written inside \\boxed{}."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model-name", default="Qwen/Qwen3.5-9B-Base")
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4, help="cross-entropy steps before sampling")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--tolerance", type=float, default=0.05)
    args = parser.parse_args()

    import tinker
    import torch
    from tinker import types
    from tinker_cookbook import model_info, renderers
    from tinker_cookbook.rl.metrics import compute_kl_sample_train
    from tinker_cookbook.supervised.data import conversation_to_datum
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    started = time.perf_counter()
    tokenizer = get_tokenizer(args.model_name)
    renderer = renderers.get_renderer(model_info.get_recommended_renderer_name(args.model_name), tokenizer)
    conversations = [
        [
            {"role": "user", "content": f"What is {a} + {b}?{SUFFIX}"},
            {"role": "assistant", "content": f"{a} + {b} = {a + b}. \\boxed{{{a + b}}}"},
        ]
        for a, b in QUESTIONS
    ]
    data = [conversation_to_datum(c, renderer, 256) for c in conversations]
    service = tinker.ServiceClient(base_url=args.base_url)
    trainer = service.create_lora_training_client(base_model=args.model_name, rank=args.rank).result()
    nll = []
    for _ in range(args.steps):
        step = trainer.forward_backward(data, "cross_entropy")
        trainer.optim_step(types.AdamParams(learning_rate=1e-3, beta1=0.9, beta2=0.95, eps=1e-8)).result()
        result = step.result()
        weights = sum(float(d.loss_fn_inputs["weights"].to_torch().sum()) for d in data)
        nll.append(result.metrics["loss:sum"] / weights)

    sampler = trainer.save_weights_and_get_sampling_client().result()
    prompt = renderer.build_generation_prompt([{"role": "user", "content": f"What is 3 + 2?{SUFFIX}"}])
    params = types.SamplingParams(max_tokens=args.max_tokens, stop=renderer.get_stop_sequences(), seed=0)
    sequences = sampler.sample(prompt, args.samples, params).result().sequences

    # the cookbook's RL datum layout: input = prompt + sampled[:-1], targets shifted by one, the sampled
    # tokens' log-probs and a mask over them
    shown, scored = [], []
    ob = prompt.length - 1
    for sequence in sequences:
        tokens = sequence.tokens
        model_input = prompt.append(types.EncodedTextChunk(tokens=tokens[:-1]))
        targets = prompt.to_ints()[1:] + tokens
        zeros = [0.0] * len(targets)
        scored.append(types.Datum(model_input=model_input, loss_fn_inputs={"target_tokens": targets, "weights": zeros}))
        shown.append(
            types.Datum(
                model_input=model_input,
                loss_fn_inputs={
                    "target_tokens": targets,
                    "logprobs": [0.0] * ob + list(sequence.logprobs),
                    "mask": types.TensorData.from_torch(torch.tensor([0.0] * ob + [1.0] * len(tokens))),
                },
            )
        )
    forward = trainer.forward(scored, "cross_entropy").result()
    training = [torch.tensor(out["logprobs"].tolist()) for out in forward.loss_fn_outputs]
    kl = compute_kl_sample_train(shown, training)  # the cookbook's own check
    gaps = [
        abs(s - t)
        for datum, train in zip(shown, training, strict=True)
        for s, t, m in zip(
            datum.loss_fn_inputs["logprobs"].tolist(), train.tolist(), datum.loss_fn_inputs["mask"].tolist(), strict=True
        )
        if m > 0
    ]
    worst = max(gaps)
    service.close("success").result()
    report = {
        "benchmark": "tinker_numerics",
        "model": args.model_name,
        "ce_steps": args.steps,
        "train_nll_per_token": nll,
        "sampled_sequences": len(sequences),
        "sampled_tokens": len(gaps),
        "kl_sample_train_v1": kl["optim/kl_sample_train_v1"],
        "kl_sample_train_v2": kl["optim/kl_sample_train_v2"],
        "max_abs_logprob_gap": worst,
        "tolerance": args.tolerance,
        "passed": worst <= args.tolerance,
        "seconds": time.perf_counter() - started,
        "machine": machine(),
        "tinker": tinker.__version__,
    }
    print(json.dumps(report))
    sys.exit(0 if report["passed"] else 1)


if __name__ == "__main__":
    main()
