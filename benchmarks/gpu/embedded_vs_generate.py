"""Tokens/s of the embedded engine against transformers' own ``generate`` on the same card, model and
batch (not run in CI: it needs a CUDA card).

Both get ``--batch`` prompts of ``--prompt-len`` tokens at once and sample ``--new-tokens`` tokens each
(temperature 1, no top-k/top-p, end-of-sequence ignored so every row runs to the limit), in bf16 with
random weights from the bench model's config. ``generate`` is the baseline; the engine also returns
each token's log-probability, as RL needs. Each figure is the best of ``--repeat`` timed passes after a
full warm-up pass. The last line is one JSON object; ``ratio`` = the engine's tokens/s over ``generate``'s.

    python benchmarks/gpu/embedded_vs_generate.py --model-config .gpu/bench-model [--batch 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from workload import TINY, machine, make_prompts, random_checkpoint


def time_generate(folder: Path, prompts: list[list[int]], opts: argparse.Namespace) -> dict[str, Any]:
    """transformers' ``generate`` on the whole batch (the prompts have one length: no padding)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, opts.dtype)).to(opts.device).eval()
    ids = torch.tensor(prompts, device=opts.device)

    def once(model: Any, new_tokens: int) -> tuple[int, float]:
        if opts.device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                             top_k=0, top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             pad_token_id=model.config.pad_token_id)
        if opts.device.startswith("cuda"):
            torch.cuda.synchronize()
        return (out.shape[1] - ids.shape[1]) * ids.shape[0], time.perf_counter() - started

    once(model, opts.new_tokens)  # warm-up: kernels and cache blocks of every length
    runs = [once(model, opts.new_tokens) for _ in range(opts.repeat)]
    del model
    if opts.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return figure(runs)


async def time_engine(folder: Path, prompts: list[list[int]], opts: argparse.Namespace) -> dict[str, Any]:
    """The embedded engine with the whole batch in flight at once."""
    from rlsdk_embedded import EmbeddedEngine

    engine = EmbeddedEngine(folder, device=opts.device, dtype=opts.dtype, max_batch_size=opts.batch)
    await engine.start()

    async def once(new_tokens: int) -> tuple[int, float]:
        params = {"max_new_tokens": new_tokens, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "ignore_eos": True}
        started = time.perf_counter()
        responses = await asyncio.gather(*(
            engine.generate({"input_ids": p, "sampling_params": params, "return_logprob": True}) for p in prompts
        ))
        return sum(r["meta_info"]["completion_tokens"] for r in responses), time.perf_counter() - started

    try:
        await once(opts.new_tokens)  # warm-up: kernels and cache blocks of every length
        runs = [await once(opts.new_tokens) for _ in range(opts.repeat)]
        return {**figure(runs), "engine_stats": vars(engine.stats)}
    finally:
        await engine.close()


def figure(runs: list[tuple[int, float]]) -> dict[str, Any]:
    tokens, seconds = max(runs, key=lambda r: r[0] / r[1])
    return {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1),
            "all_tokens_per_s": [round(t / s, 1) for t, s in runs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-config", default=".gpu/bench-model")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="Shrink the model (for checking on a CPU).")
    opts = parser.parse_args()

    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="embedded-vs-generate-") as tmp:
        folder = random_checkpoint(opts.model_config, Path(tmp) / "model", dtype=opts.dtype, device=opts.device,
                                   overrides=TINY if opts.tiny else None)
        prompts = make_prompts(AutoTokenizer.from_pretrained(folder), opts.batch, opts.prompt_len)
        generate = time_generate(folder, prompts, opts)
        engine = asyncio.run(time_engine(folder, prompts, opts))
    report = {
        "benchmark": "embedded_vs_generate",
        "inputs": {"model_config": str(opts.model_config), "tiny": opts.tiny, "weights": "random",
                   "device": opts.device, "dtype": opts.dtype, "batch": opts.batch, "prompt_len": opts.prompt_len,
                   "new_tokens": opts.new_tokens, "repeat": opts.repeat},
        "transformers_generate": generate,
        "embedded_engine": engine,
        "machine": machine(),
        "ratio": round(engine["tokens_per_s"] / generate["tokens_per_s"], 3),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
