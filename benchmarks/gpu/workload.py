"""What the GPU benchmarks share: a random-weight checkpoint built from a config, prompts of an exact
token length that survive a text round trip, the workload's options, and a description of the machine.

Random weights make the model's next-token distribution nearly flat, so sampled outputs run to their
length limit (an end-of-sequence token is drawn about once per 49,152 tokens) and every path measured
generates the same number of tokens.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import platform
import random
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16}
"""Config overrides for a model small enough to check the scripts on a CPU in seconds."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def add_workload_options(parser: argparse.ArgumentParser, repeat_help: str | None = None) -> None:
    """The shared workload's options: ``--requests`` prompts of ``--prompt-len`` tokens, ``--new-tokens`` each
    at ``--temperature``, ``--in-flight`` at once, the best of ``--repeat`` passes."""
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--in-flight", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=2, help=repeat_help)


def started_vllm(args: Any, loop: Any) -> tuple[Any, dict[str, Any]]:
    """The vLLM plugin's client for the run ``args``, started on ``loop`` (a ``BackgroundLoop``), and its
    start's figures: the seconds it took and the server's command line."""
    from rlsdk_engine_vllm.plugin import vllm_engine

    client = vllm_engine(args)
    started = time.perf_counter()
    loop.run(client.start())
    return client, {
        "startup_seconds": round(time.perf_counter() - started, 1),
        "command": " ".join(client.launcher.plan.command),
    }


def random_checkpoint(config_dir: str | Path, out_dir: str | Path, *, dtype: str = "bfloat16",
                      device: str = "cpu", overrides: dict[str, Any] | None = None, seed: int = 0) -> Path:
    """Save a Hugging Face folder with ``config_dir``'s config (``overrides`` applied) and tokenizer and
    freshly initialised random weights, so ``from_pretrained`` and the embedded engine can load it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config_dir, out_dir = Path(config_dir), Path(out_dir)
    config = AutoConfig.from_pretrained(config_dir)
    for key, value in (overrides or {}).items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    for name in TOKENIZER_FILES:
        if (config_dir / name).is_file():
            shutil.copy(config_dir / name, out_dir / name)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out_dir


QWEN3 = {"head_dim": 128, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 40960,
         "vocab_size": 151936, "hidden_act": "silu"}
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-4b": {**QWEN3, "model_type": "qwen3", "hidden_size": 2560, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 9728,
                 "tie_word_embeddings": True},
    "qwen3-8b": {**QWEN3, "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 12288,
                 "tie_word_embeddings": False},
    "qwen3-30b-a3b": {**QWEN3, "model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
                      "num_attention_heads": 32, "num_key_value_heads": 4, "intermediate_size": 6144,
                      "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
                      "norm_topk_prob": True, "tie_word_embeddings": False},
}
"""Published shapes (config.json of Qwen3-4B, Qwen3-8B, Qwen3-30B-A3B), for random weights."""
SHAPES["qwen3-moe-32e"] = {**SHAPES["qwen3-30b-a3b"], "num_hidden_layers": 8, "num_experts": 32}
"""Qwen3-30B-A3B's layer scaled down to fit one or two GPUs: 8 layers of 32 experts (8 active)."""


PLAIN_CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                       "{% if add_generation_prompt %}assistant: {% endif %}")


def shape_checkpoint(shape: str, tokenizer_dir: str | Path, out_dir: str | Path, *, dtype: str = "bfloat16",
                     device: str = "cpu", overrides: dict[str, Any] | None = None, seed: int = 0) -> Path:
    """A Hugging Face folder of ``SHAPES[shape]`` (``overrides`` applied) with random weights and the
    tokenizer of ``tokenizer_dir`` (any: token ids past its vocabulary decode to nothing)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = {**SHAPES[shape], **(overrides or {})}
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    out_dir, tokenizer_dir = Path(out_dir), Path(tokenizer_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    for name in TOKENIZER_FILES[:3]:  # not generation_config.json: the shape's own ids go there
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, out_dir / name)
    tokenizer_config = out_dir / "tokenizer_config.json"
    if tokenizer_config.is_file():  # a plain template where the tokenizer has none (the bench model's)
        settings = json.loads(tokenizer_config.read_text())
        settings.setdefault("chat_template", PLAIN_CHAT_TEMPLATE)
        tokenizer_config.write_text(json.dumps(settings, indent=2))
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out_dir


def parameter_counts(config: dict[str, Any]) -> dict[str, float]:
    """Parameters of a Llama/Qwen3(-MoE) config: ``body`` (attention and MLP matrices; ``active``: with
    only the experts a token reaches), ``output`` (the vocabulary projection) and ``total``."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    attention = hidden * head_dim * (2 * config["num_attention_heads"] + 2 * config["num_key_value_heads"])
    experts = config.get("num_experts") or config.get("num_local_experts") or 0
    if experts:
        expert = 3 * hidden * config["moe_intermediate_size"]
        mlp_total, mlp_active = experts * expert + experts * hidden, config["num_experts_per_tok"] * expert
    else:
        mlp_total = mlp_active = 3 * hidden * config["intermediate_size"]
    output = config["vocab_size"] * hidden
    embeddings = output if config.get("tie_word_embeddings") else 2 * output
    return {"body": layers * (attention + mlp_total), "active": layers * (attention + mlp_active),
            "output": output, "total": layers * (attention + mlp_total) + embeddings}


def word_tokens(tokenizer: Any) -> list[int]:
    """Token ids that are one lower-case word with a leading space (`` cat``): a text made of them
    tokenizes back to exactly one token per word."""
    ids = []
    for token, token_id in tokenizer.get_vocab().items():
        if re.fullmatch(r"\u0120[a-z]{3,8}", token):  # byte-level BPE writes the space as U+0120
            ids.append(token_id)
    return sorted(ids)


def make_prompts(tokenizer: Any, count: int, length: int, seed: int = 0) -> list[list[int]]:
    """``count`` prompts of exactly ``length`` token ids each, whose decoded text encodes back to them."""
    rng = random.Random(seed)
    vocab = word_tokens(tokenizer)
    prompts = [[rng.choice(vocab) for _ in range(length)] for _ in range(count)]
    for ids in prompts[:8]:
        again = tokenizer(tokenizer.decode(ids), add_special_tokens=False)["input_ids"]
        if again != ids:
            raise RuntimeError("prompt text does not round-trip through the tokenizer")
    return prompts


def write_dataset(tokenizer: Any, prompts: list[list[int]], path: str | Path, label: str = "0") -> Path:
    """A JSONL dataset of the prompts as text (``input``) with a fixed ``label``."""
    path = Path(path)
    with open(path, "w") as f:
        for ids in prompts:
            f.write(json.dumps({"input": tokenizer.decode(ids), "label": label}) + "\n")
    return path


ENGINE_TRACE = "RLSDK_BENCH_ENGINE_TRACE"
"""Environment variable naming a file: ``to_length`` notes the engine's counters before and after each
call (engines with ``stats`` only) and the process writes them there, one JSON line per call, when it
exits (no file work inside a step), so the run's engine time can be set against its wall time."""
_calls: list[dict[str, Any]] = []
_in_flight = 0


async def sample_groups(
    engine: Any, prompts: list[list[int]], samples: int, new_tokens: int, **sampling: Any
) -> list[list[Any]]:
    """``samples`` responses per prompt (token ids) from an SGLang-protocol ``engine``'s ``generate``, at
    temperature 1 (and ``sampling``) with log-probs; random +-1 rewards (a train step with advantages that
    are not zero)."""
    import asyncio

    from rlsdk import Sample

    rng = random.Random(0)
    params = {"max_new_tokens": new_tokens, "temperature": 1.0, **sampling}

    async def one(group: int, index: int, ids: list[int]) -> Sample:
        out = await engine.generate({"input_ids": ids, "sampling_params": params, "return_logprob": True})
        assert isinstance(out, dict)
        entries = out["meta_info"]["output_token_logprobs"]
        tokens = [int(e[1]) for e in entries]
        return Sample(
            group_index=group,
            index=index,
            tokens=ids + tokens,
            response_length=len(tokens),
            rollout_log_probs=[float(e[0]) for e in entries],
            reward=rng.choice([-1.0, 1.0]),
            status=Sample.Status.COMPLETED,
        )

    groups = [asyncio.gather(*(one(g, i, p) for i in range(samples))) for g, p in enumerate(prompts)]
    return [list(group) for group in await asyncio.gather(*groups)]


async def to_length(args: Any, sample: Any, sampling_params: dict[str, Any]) -> Any:
    """A custom generate for ``rlsdk run --custom-generate workload:to_length``: rlsdk's single-turn
    generate with ``ignore_eos``, so every response runs to ``max_new_tokens`` as in the baselines.
    The ``/proc`` counters are read only by the first call to start and the last to end while calls
    overlap (the others reuse that reading), so the probe adds two readings per step, not one per call."""
    from rlsdk.rollout.generate import generate
    from rlsdk.runtime import get_runtime

    global _in_flight
    stats = getattr(get_runtime(args).engine, "stats", None)
    before = engine_counters(stats, fresh=_in_flight == 0)
    _in_flight += 1
    try:
        result = await generate(args, sample, {**sampling_params, "ignore_eos": True})
    finally:
        _in_flight -= 1
    if stats is not None and os.environ.get(ENGINE_TRACE):
        if not _calls:
            atexit.register(_write_calls, os.environ[ENGINE_TRACE])
        _calls.append({"before": before, "after": engine_counters(stats, fresh=_in_flight == 0)})
    return result


def _write_calls(path: str) -> None:
    with open(path, "w") as f:
        f.writelines(json.dumps(call) + "\n" for call in _calls)


class _GcClock:
    """Seconds this process spent in garbage collections (every thread stops for them)."""

    seconds = 0.0
    _started = 0.0

    @classmethod
    def callback(cls, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            cls._started = time.perf_counter()
        else:
            cls.seconds += time.perf_counter() - cls._started


gc.callbacks.append(_GcClock.callback)  # both measured processes import this module


def _stat_fields(path: str) -> list[str]:
    """A process's or thread's ``stat`` fields after its name (Linux ``/proc``)."""
    return Path(path).read_text().rsplit(")", 1)[1].split()


def _thread_counters() -> dict[str, float]:
    """The embedded engine thread's CPU seconds, context switches and last core; the CPU seconds of the
    process's other threads (the loop, the progress display, torch's and CUDA's); the busy seconds of
    the whole machine (other processes included: grader workers). Zeros where ``/proc`` is missing.
    Four files, whatever the number of threads: the reading sits inside the ``rlsdk run`` step it probes."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    engine = next((t.native_id for t in threading.enumerate() if t.name == "rlsdk-embedded"), None)
    counters = {"engine_cpu_seconds": 0.0, "switches": 0, "forced_switches": 0, "engine_on_cpu": -1,
                "other_threads_cpu_seconds": 0.0, "machine_busy_seconds": 0.0}
    try:
        cpu = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        process = _stat_fields("/proc/self/stat")
        if engine is not None:
            fields = _stat_fields(f"/proc/self/task/{engine}/stat")
            status = dict(line.split(":", 1) for line in Path(f"/proc/self/task/{engine}/status").read_text()
                          .splitlines() if ":" in line)
    except OSError:
        return counters
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in cpu[:8])
    counters["machine_busy_seconds"] = (user + nice + system + irq + softirq + steal) / ticks
    total = (int(process[11]) + int(process[12])) / ticks  # utime + stime of every thread
    if engine is not None:
        engine_seconds = (int(fields[11]) + int(fields[12])) / ticks
        counters.update(engine_cpu_seconds=engine_seconds, engine_on_cpu=int(fields[36]),
                        switches=int(status["voluntary_ctxt_switches"]),
                        forced_switches=int(status["nonvoluntary_ctxt_switches"]))
        total -= engine_seconds
    counters["other_threads_cpu_seconds"] = total
    return counters


_last_thread_counters: dict[str, float] = {}


def engine_counters(stats: Any, fresh: bool = True) -> dict[str, float] | None:
    """The embedded engine's step count and time in steps, thread and machine CPU counters (the last
    reading unless ``fresh``), the process's garbage-collection time, with the wall clock."""
    if stats is None:
        return None
    if fresh or not _last_thread_counters:
        _last_thread_counters.update(_thread_counters())
    return {"time": time.perf_counter(), "steps": stats.steps, "busy_seconds": stats.busy_seconds,
            "gc_seconds": _GcClock.seconds, **_last_thread_counters}


COUNTERS = ("time", "steps", "busy_seconds", "gc_seconds", "engine_cpu_seconds", "switches", "forced_switches",
            "other_threads_cpu_seconds", "machine_busy_seconds")


def engine_share(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Between two ``engine_counters``: the share of wall time the engine spent in steps, ms per step,
    the share of step time its thread was on a CPU, the share of wall time in garbage collection, the
    engine thread's context switches per step (waits for the GIL or the GPU, and preemptions), the
    process's other threads' CPU time over wall time, and the machine's busy cores."""
    delta = {k: after[k] - before[k] for k in COUNTERS}
    wall, busy, steps = delta["time"], delta["busy_seconds"], delta["steps"]
    return {"busy_share": round(busy / wall, 3) if wall else 0.0,
            "ms_per_step": round(1000 * busy / steps, 2) if steps else 0.0, "engine_steps": steps,
            "engine_cpu_share": round(delta["engine_cpu_seconds"] / busy, 3) if busy else 0.0,
            "gc_share": round(delta["gc_seconds"] / wall, 4) if wall else 0.0,
            "switches_per_step": round(delta["switches"] / steps, 2) if steps else 0.0,
            "forced_switches_per_step": round(delta["forced_switches"] / steps, 2) if steps else 0.0,
            "other_threads_cpu_share": round(delta["other_threads_cpu_seconds"] / wall, 3) if wall else 0.0,
            "machine_busy_cores": round(delta["machine_busy_seconds"] / wall, 2) if wall else 0.0,
            "engine_on_cpu": after.get("engine_on_cpu", -1)}


def machine() -> dict[str, Any]:
    """The card, its driver and the software versions the figures were taken with."""
    import torch
    import transformers

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_count": _cpu_count(),
        **_cpu_topology(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(card=torch.cuda.get_device_name(0), card_memory_gib=round(props.total_memory / 2**30, 1),
                    cuda=torch.version.cuda, driver=_driver())
    else:
        info["card"] = None
    return info


def _cpu_topology() -> dict[str, Any]:
    """Whether cores share a physical core (SMT) and how many NUMA nodes there are (Linux ``/sys``)."""
    smt = Path("/sys/devices/system/cpu/smt/active")
    return {"smt": smt.read_text().strip() == "1" if smt.exists() else None,
            "numa_nodes": len(list(Path("/sys/devices/system/node").glob("node[0-9]*")))}


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def _driver() -> str | None:
    """The NVIDIA driver's version: from NVML (``nvidia-ml-py``, which CUDA builds of torch bring), else
    from ``nvidia-smi`` (not on ``PATH`` on every GPU machine)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # not installed, or no driver library
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def run_reporting(main: Callable[[], None], benchmark: str, key: str = "error") -> None:
    """Run a device script's ``main``; on any failure print one JSON line naming it (under ``key``) before
    re-raising, since the device call's one answer is the last line printed."""
    try:
        main()
    except BaseException as exc:
        import traceback

        print(
            json.dumps(
                {
                    "benchmark": benchmark,
                    key: f"{type(exc).__name__}: {exc}"[:2000],
                    "traceback": traceback.format_exc()[-6000:],
                }
            )
        )
        raise
