"""LoRA against a real SGLang 0.5.17 on one GPU (not run in CI; one device call of about 5 minutes; the last
line printed is one JSON object):

1. starts SGLang on ``--model`` with ``--enable-lora --max-lora-rank 16 --lora-target-modules all`` through
   rlsdk's process launcher (its own process group, stopped with the script and by the kernel if the script
   dies: no server left holding the GPU);
2. captures its answers to the LoRA protocol (``/load_lora_adapter`` twice with one name, ``/generate`` with
   ``lora_path`` known and unknown, ``/update_weight_version``, ``/unload_lora_adapter`` twice) into
   ``--output/sglang-0.5.17-lora-responses.json``: the ground truth for ``rlsdk serve``'s LoRA endpoints;
3. checks that SGLang applies an adapter: a probe's log-probs with a random adapter against peft's (the
   adapter unmerged, float32) and against the base model's;
4. trains: ``rlsdk run --train --lora-rank 16 --lr 1e-4`` against that server (``--engine URL``: each step's
   adapter goes through ``/load_lora_adapter`` from disk) on the default demo (the shipped single-digit
   arithmetic, its chat template, the held-out eval before the first step and every 4 steps), as
   ``benchmarks/learning.py`` runs it on CPU (0.58 -> 0.94 there). The held-out reward must rise, and the
   rewards must vary (a run whose every reward is 0 trains on nothing);
5. applied or not: the trained adapter loaded once more, the held-out prompts answered greedily with it, and
   those answers scored three ways: by SGLang with the adapter, by SGLang without it, by peft (base model
   with the adapter, float32). With the adapter SGLang must match peft within the bfloat16 noise; without it
   (what a run that forgot to load the adapter serves) it must be off by at least 4x that.

    PYTHONPATH=/tmp/rl:benchmarks/gpu python3 benchmarks/gpu/sglang_lora.py --model /tmp/rlsdk-models/MODEL \
        --sglang-python /tmp/sglang-python --output /tmp/sglang-lora
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import urllib.error
import urllib.request

from learning_gpu import run_until, shipped  # it puts benchmarks/ on the path
from learning import RUN_TRAIN  # noqa: I001
from workload import machine

from rlsdk.trainer_api import ManagedProcess

PROBE_TOKENS = 24


def call(url: str, body: dict[str, Any] | None = None, timeout: float = 120.0) -> tuple[int, Any]:
    """POST ``body`` (GET without one); the status and the body (JSON where it is)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            status, text = reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def start_server(python: str, model: Path, port: int, log: Path) -> ManagedProcess:
    command = [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--mem-fraction-static",
        "0.5",
        "--enable-lora",
        "--max-lora-rank",
        "16",
        "--lora-target-modules",
        "all",
        "--max-loras-per-batch",
        "4",
        "--disable-cuda-graph",
    ]  # a start without graph capture: the protocol and log-probs are the same
    server = ManagedProcess("sglang-lora", command, log, cwd="/tmp")
    server.start()
    return server


def wait_ready(url: str, server: ManagedProcess, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.exit_code() is not None:
            raise RuntimeError(f"SGLang exited with {server.exit_code()}: {server.log_tail()}")
        try:
            if call(f"{url}/health", timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError("SGLang not ready")


def make_adapter(model: Path, folder: Path, std: float) -> Any:
    """A rank-16 adapter on every linear layer with random B (``std``), saved as PEFT does; the peft model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).cuda()
    peft_model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    for name, parameter in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=std)
    peft_model.save_pretrained(folder)
    return peft_model.eval()


def peft_log_probs(peft_model: Any, tokens: list[int], adapter: bool) -> list[float]:
    import torch

    with torch.no_grad():
        ids = torch.tensor([tokens], device="cuda")
        if adapter:
            logits = peft_model(input_ids=ids).logits[0, :-1].float()
        else:
            with peft_model.disable_adapter():
                logits = peft_model(input_ids=ids).logits[0, :-1].float()
        picked = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
    return picked.tolist()[-PROBE_TOKENS:]


def served_log_probs(
    url: str, tokens: list[int], lora: str | None, scored: int = PROBE_TOKENS
) -> list[float]:
    """SGLang's log-probs of the last ``scored`` tokens of ``tokens``."""
    body: dict[str, Any] = {
        "input_ids": tokens,
        "return_logprob": True,
        "logprob_start_len": len(tokens) - scored - 1,
        "sampling_params": {"max_new_tokens": 0, "temperature": 1.0},
    }
    if lora:
        body["lora_path"] = lora
    entries = call(f"{url}/generate", body)[1]["meta_info"]["input_token_logprobs"][1:]
    return [float(e[0]) for e in entries]


def capture(url: str, adapter: Path) -> dict[str, Any]:
    """Status and body of each LoRA call, in order."""
    calls = [
        ("load", "/load_lora_adapter", {"lora_name": "probe", "lora_path": str(adapter)}),
        ("load_same_name", "/load_lora_adapter", {"lora_name": "probe", "lora_path": str(adapter)}),
        ("load_missing_path", "/load_lora_adapter", {"lora_name": "gone", "lora_path": "/no/such/adapter"}),
        (
            "generate_lora",
            "/generate",
            {
                "input_ids": [1, 2, 3, 4],
                "lora_path": "probe",
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": 4, "temperature": 0},
            },
        ),
        (
            "generate_unknown_lora",
            "/generate",
            {"input_ids": [1, 2, 3, 4], "lora_path": "nope", "sampling_params": {"max_new_tokens": 4}},
        ),
        (
            "update_weight_version",
            "/update_weight_version",
            {"new_version": "lora-7", "abort_all_requests": False},
        ),
        ("unload", "/unload_lora_adapter", {"lora_name": "probe"}),
        ("unload_unknown", "/unload_lora_adapter", {"lora_name": "probe"}),
    ]
    out: dict[str, Any] = {}
    for name, path, body in calls:
        status, answer = call(f"{url}{path}", body)
        out[name] = {"request": {"path": path, "body": body}, "status": status, "body": answer}
    out["model_info_after"] = call(f"{url}/model_info")[1]
    return out


def rounded(row: dict[str, Any], key: str, digits: int) -> float | None:
    """``row[key]`` rounded; None where the step did not record it (a failed step writes nulls)."""
    value = row.get(key)
    return None if value is None else round(value, digits)


def train_against(url: str, model: Path, out: Path, opts: argparse.Namespace) -> dict[str, Any]:
    """The default demo with a rank-16 adapter against the server, stopped after ``opts.minutes``."""
    command = [
        *RUN_TRAIN,
        "--engine",
        url,
        "--hf-checkpoint",
        str(model),
        "--lora-rank",
        "16",
        "--lr",
        "1e-4",
        "--num-rollout",
        str(opts.steps),
        "--eval-interval",
        "4",
        "--output",
        str(out / "run"),
        "--overwrite",
    ]
    code, timed_out = run_until(command, out / "run.log", opts.minutes)
    rows = (
        [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
        if (out / "run" / "metrics.jsonl").exists()
        else []
    )
    evals = (
        [json.loads(line) for line in (out / "run" / "eval.jsonl").read_text().splitlines()]
        if (out / "run" / "eval.jsonl").exists()
        else []
    )
    key = next((k for row in evals for k in row if k.endswith("/reward_mean")), None)
    heldout = [round(row[key], 4) for row in evals if key in row]
    rewards = [rounded(r, "rollout/reward_mean", 4) for r in rows]
    return {
        "exit_code": code,
        "timed_out": timed_out,
        "steps": len(rows),
        "heldout_curve": heldout,
        "heldout_gain": round(heldout[-1] - heldout[0], 4) if len(heldout) > 1 else None,
        "reward_mean": rewards,
        "steps_with_varied_rewards": sum(
            1 for r in rows if (r.get("rollout/reward_group_std_mean") or 0) > 0
        ),
        "grad_norm": [rounded(r, "train/grad_norm", 4) for r in rows],
        "trust_check_max_diff": [rounded(r, "train/sync_logprob_max_diff", 4) for r in rows],
        "trust_check_mean_diff": [rounded(r, "train/sync_logprob_mean_diff", 5) for r in rows],
        "sync_seconds": [rounded(r, "train/sync_seconds", 3) for r in rows],
        "command": " ".join(command),
        "error_tail": None
        if code == 0 or timed_out
        else (out / "run.log").read_text(errors="replace")[-800:],
    }


def applied_or_not(url: str, model: Path, adapter: Path, prompts: list[list[int]]) -> dict[str, Any]:
    """The trained adapter's greedy answers to ``prompts``, scored by SGLang with it, SGLang without it and
    peft (float32): mean per-token gaps to peft with and without the adapter."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    status, answer = call(f"{url}/load_lora_adapter", {"lora_name": "trained", "lora_path": str(adapter)})
    if status != 200:
        return {"error": f"loading the trained adapter: {status} {answer}"}
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).cuda()
    peft_model = PeftModel.from_pretrained(base, str(adapter)).eval()
    with_gaps, without_gaps, effect = [], [], []
    for prompt in prompts:
        body = {
            "input_ids": prompt,
            "lora_path": "trained",
            "sampling_params": {"max_new_tokens": 24, "temperature": 0},
        }
        reply = call(f"{url}/generate", body)[1]
        response = reply["output_ids"] if "output_ids" in reply else reply["meta_info"].get("output_ids", [])
        if not response:
            continue
        tokens, scored = prompt + list(response), len(response)
        want = peft_log_probs(peft_model, tokens, True)[-scored:] if scored <= PROBE_TOKENS else []
        if not want:
            continue
        base_want = peft_log_probs(peft_model, tokens, False)[-scored:]
        served_with = served_log_probs(url, tokens, "trained", scored)
        served_without = served_log_probs(url, tokens, None, scored)
        with_gaps += [abs(a - b) for a, b in zip(served_with, want, strict=True)]
        without_gaps += [abs(a - b) for a, b in zip(served_without, want, strict=True)]
        effect += [abs(a - b) for a, b in zip(want, base_want, strict=True)]
    call(f"{url}/unload_lora_adapter", {"lora_name": "trained"})
    applied, missing = statistics.fmean(with_gaps), statistics.fmean(without_gaps)
    return {
        "tokens": len(with_gaps),
        "mean_gap_with_adapter": round(applied, 5),
        "mean_gap_without_adapter": round(missing, 5),
        "adapter_effect_mean": round(statistics.fmean(effect), 5),
        "ratio": round(missing / max(applied, 1e-9), 2),
        "tells_them_apart": missing >= 4 * applied,
    }


def newest_adapter(run: Path) -> Path | None:
    """The last adapter the run synced (``sync-weights/rlsdk_v<N>``)."""
    folders = sorted(
        (run / "sync-weights").glob("rlsdk_v*"), key=lambda p: int(p.name[7:]) if p.name[7:].isdigit() else -1
    )
    return folders[-1] if folders else None


def heldout_prompts(model: Path, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = [json.loads(line) for line in shipped("arithmetic-eval.jsonl").read_text().splitlines()[:count]]
    texts = [
        tokenizer.apply_chat_template(
            row["input"] if isinstance(row["input"], list) else [{"role": "user", "content": row["input"]}],
            add_generation_prompt=True,
            tokenize=False,
        )
        for row in rows
    ]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a Hugging Face folder (real weights)")
    parser.add_argument("--sglang-python", default=sys.executable)
    parser.add_argument("--output", type=Path, default=Path(tempfile.mkdtemp(prefix="sglang-lora-")))
    parser.add_argument("--port", type=int, default=30100)
    parser.add_argument("--steps", type=int, default=16, help="the demo's 16")
    parser.add_argument("--minutes", type=float, default=5.0, help="stop the training run after this long")
    opts = parser.parse_args()
    opts.output.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{opts.port}"
    server = start_server(opts.sglang_python, opts.model, opts.port, opts.output / "sglang-lora.log")
    report: dict[str, Any] = {"benchmark": "sglang_lora", "machine": machine()}
    try:
        wait_ready(url, server)
        adapter = opts.output / "probe-adapter"
        peft_model = make_adapter(opts.model, adapter, std=0.02)
        responses = capture(url, adapter)
        (opts.output / "sglang-0.5.17-lora-responses.json").write_text(json.dumps(responses, indent=1))
        report["protocol"] = {
            name: entry["status"]
            for name, entry in responses.items()
            if isinstance(entry, dict) and "status" in entry
        }
        call(f"{url}/load_lora_adapter", {"lora_name": "check", "lora_path": str(adapter)})
        tokens = list(range(100, 100 + 16 + PROBE_TOKENS + 1))
        with_adapter = served_log_probs(url, tokens, "check")
        base = served_log_probs(url, tokens, None)
        want, want_base = peft_log_probs(peft_model, tokens, True), peft_log_probs(peft_model, tokens, False)
        report["adapter_vs_peft_max_diff"] = max(abs(a - b) for a, b in zip(with_adapter, want, strict=True))
        report["base_vs_peft_base_max_diff"] = max(abs(a - b) for a, b in zip(base, want_base, strict=True))
        report["adapter_effect_max"] = max(abs(a - b) for a, b in zip(want, want_base, strict=True))
        call(f"{url}/unload_lora_adapter", {"lora_name": "check"})
        del peft_model
        print(json.dumps({**report, "partial": "before the training run"}), flush=True)  # kept if cut short
        report["run"] = train_against(url, opts.model, opts.output, opts)
        adapter = newest_adapter(opts.output / "run")
        report["trained_adapter"] = str(adapter)
        report["applied_or_not"] = (
            applied_or_not(url, opts.model, adapter, heldout_prompts(opts.model, 16))
            if adapter
            else {"error": "none"}
        )
        run = report["run"]
        report["passed"] = (
            run["steps"] >= 8
            and (run["heldout_gain"] or 0) > 0
            and run["steps_with_varied_rewards"] >= run["steps"] // 2
            and bool(report["applied_or_not"].get("tells_them_apart"))
            and report["adapter_vs_peft_max_diff"] < report["adapter_effect_max"] / 4
        )
    except Exception as exc:  # the report says what failed; the log has the rest
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["passed"] = False
    finally:
        server.stop()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
