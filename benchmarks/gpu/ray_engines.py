"""SGLang engines as Ray actors, a GPU each, one engine actor SIGKILLed mid-step (not run in CI; one device
call, the last line printed is one JSON object). Two engines by default; ``--engines 1 --spares 1``
serves from one and keeps a started spare on the second GPU.

A rollout-only ``rlsdk run --ray --engine sglang --rollout-num-gpus 2 --rollout-num-gpus-per-engine 1``
(in process, as ``run_job``) on ``--hf-checkpoint`` (the bench model's config with random weights:
``sglang_load_format=dummy``), the shipped arithmetic2-train prompts, ``--prompts`` x ``--samples`` a step
for ``--steps`` steps. From the second step on, ``Killer`` (benchmarks/faults.py) SIGKILLs one engine
actor's process once while it has requests in flight: its SGLang server dies with it (PR_SET_PDEATHSIG),
the pool removes its placement group and the run goes on. Without a spare, a new actor starts its server
on the freed GPU (SGLang's whole start); with one, the spare takes the weights and the dead engine's place,
and a new spare starts on the freed GPU. Reported: ``samples_lost`` (the ledger audit, must be 0),
``steps_completed``, ``returned`` (samples the kill sent back to the buffer), ``detection_seconds`` and ``recovery_seconds`` (from the SIGKILL until
noticed, and until the new engine took requests), and per step the rollout's tokens/s and seconds. Before
the last step the run waits for the restarted engine (``waited_for_rejoin_s``), so that step runs on both.

    PYTHONPATH=/tmp/rl:benchmarks/gpu:/tmp/site python3 benchmarks/gpu/ray_engines.py \\
        --hf-checkpoint .gpu/bench-model --sglang-python /tmp/sglang-python
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from workload import machine, run_reporting

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for faults.py
from faults import Killer, run_with_killer  # noqa: E402


def shipped(name: str) -> Path:
    """A dataset shipped inside the installed rlsdk package."""
    import rlsdk

    return Path(rlsdk.__file__).parent / "datasets" / name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hf-checkpoint", default=".gpu/bench-model")
    parser.add_argument("--sglang-python", default="/tmp/sglang-python")
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--max-response-len", type=int, default=128)
    parser.add_argument("--mem-fraction", type=float, default=0.7)
    parser.add_argument("--engines", type=int, default=2, help="Serving engines, a GPU each.")
    parser.add_argument(
        "--spares", type=int, default=0, help="Spare engines (started, a GPU each) to take a dead one's place."
    )
    parser.add_argument("--kills", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="/tmp/ray-engines")
    opts = parser.parse_args()

    from rlsdk import RolloutConfig

    args = RolloutConfig(
        engine="sglang",
        hf_checkpoint=str(Path(opts.hf_checkpoint).resolve()),
        sglang_python=opts.sglang_python,
        sglang_mem_fraction_static=opts.mem_fraction,
        rollout_num_gpus=opts.engines,
        rollout_num_gpus_per_engine=1,
        ray_spare_engines=opts.spares,
        prompt_data=str(shipped("arithmetic2-train.jsonl")),
        label_key="label",
        apply_chat_template=True,  # the bench model's tokenizer has no template of its own: a plain one
        apply_chat_template_kwargs={"chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"},
        rollout_shuffle=True,
        rollout_batch_size=opts.prompts,
        n_samples_per_prompt=opts.samples,
        rollout_max_response_len=opts.max_response_len,
        num_rollout=opts.steps,
        output_dir=opts.output,
        overwrite=True,
        ray_address="local",
        extra={"sglang_load_format": "dummy"},
    )
    def on_step(rollout_id: int, metrics: dict[str, Any], killer: Killer) -> None:
        print(
            f"step {rollout_id}: {metrics['rollout/tokens_per_s']:.0f} tokens/s, returned "
            f"{metrics['ledger/returned']}, kept {metrics['ledger/kept']}",
            file=sys.stderr,
        )
        if rollout_id == opts.steps - 2 and killer.killed_at:  # the last step on both engines again
            waited = time.perf_counter()
            deadline = waited + 600
            while time.perf_counter() < deadline and not all(r.rejoined_at for r in killer.pool.recoveries):
                time.sleep(0.5)
            metrics["waited_for_rejoin_s"] = round(time.perf_counter() - waited, 1)

    report, steps = run_with_killer(args, opts.kills, opts.seed, Path(opts.output), on_step)
    print(
        json.dumps(
            {
                "benchmark": "ray_engines",
                "engines": opts.engines,
                "spares": opts.spares,
                "gpus_per_engine": 1,
                "prompts": opts.prompts,
                "samples_per_prompt": opts.samples,
                "max_response_len": opts.max_response_len,
                **report,
                "tokens_per_s": [round(m["rollout/tokens_per_s"], 1) for m in steps],
                "waited_for_rejoin_s": sum(m.get("waited_for_rejoin_s", 0.0) for m in steps),
                "rollout_seconds": [round(m["rollout/seconds"], 2) for m in steps],
                "logs": str(Path(opts.output) / "logs"),
                "machine": machine(),
            }
        )
    )

if __name__ == "__main__":
    run_reporting(main, "ray_engines")
