"""LoRA against a real SGLang 0.5.17 on one GPU (not run in CI; one device call of a few minutes; the last
line printed is one JSON object):

1. starts SGLang on ``--model`` with ``--enable-lora --max-lora-rank 16 --lora-target-modules all``;
2. captures its answers to the LoRA protocol (``/load_lora_adapter`` twice with one name, ``/generate`` with
   ``lora_path`` known and unknown, ``/update_weight_version``, ``/unload_lora_adapter`` twice) into
   ``--output/sglang-0.5.17-lora-responses.json``: the ground truth for ``rlsdk serve``'s LoRA endpoints;
3. checks that SGLang applies an adapter: a probe's log-probs with a random adapter against peft's (the
   adapter unmerged, float32) and against the base model's;
4. runs ``rlsdk run --train --lora-rank 16`` against that server (``--engine URL``: each step's adapter goes
   through ``/load_lora_adapter`` from disk) and reports every step's trust-check gap.

    PYTHONPATH=/tmp/rl:benchmarks/gpu python3 benchmarks/gpu/sglang_lora.py --model /tmp/rlsdk-models/MODEL \\
        --sglang-python /tmp/sglang-python --output /tmp/gpu-results
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import urllib.error
import urllib.request

from sglang_checks import arithmetic_dataset
from workload import machine

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


def start_server(python: str, model: Path, port: int, log: Path) -> subprocess.Popen:
    command = [python, "-m", "sglang.launch_server", "--model-path", str(model), "--host", "127.0.0.1",
               "--port", str(port), "--mem-fraction-static", "0.5", "--enable-lora", "--max-lora-rank", "16",
               "--lora-target-modules", "all", "--max-loras-per-batch", "4",
               "--disable-cuda-graph"]  # a start without graph capture: the protocol and log-probs are the same
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(url: str, server: subprocess.Popen, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"SGLang exited with {server.returncode}")
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


def served_log_probs(url: str, tokens: list[int], lora: str | None) -> list[float]:
    body: dict[str, Any] = {"input_ids": tokens, "return_logprob": True, "logprob_start_len": len(tokens) - PROBE_TOKENS - 1,
                            "sampling_params": {"max_new_tokens": 0, "temperature": 1.0}}
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
        ("generate_lora", "/generate", {"input_ids": [1, 2, 3, 4], "lora_path": "probe", "return_logprob": True,
                                        "sampling_params": {"max_new_tokens": 4, "temperature": 0}}),
        ("generate_unknown_lora", "/generate", {"input_ids": [1, 2, 3, 4], "lora_path": "nope",
                                                "sampling_params": {"max_new_tokens": 4}}),
        ("update_weight_version", "/update_weight_version", {"new_version": "lora-7", "abort_all_requests": False}),
        ("unload", "/unload_lora_adapter", {"lora_name": "probe"}),
        ("unload_unknown", "/unload_lora_adapter", {"lora_name": "probe"}),
    ]
    out: dict[str, Any] = {}
    for name, path, body in calls:
        status, answer = call(f"{url}{path}", body)
        out[name] = {"request": {"path": path, "body": body}, "status": status, "body": answer}
    out["model_info_after"] = call(f"{url}/model_info")[1]
    return out


def train_against(url: str, model: Path, out: Path, steps: int) -> dict[str, Any]:
    data = arithmetic_dataset(out / "train.jsonl", 256)
    command = [sys.executable, "-m", "rlsdk_cli.app", "run", "--train", "--engine", url, "--hf-checkpoint", str(model),
               "--data", str(data), "--rm", "math", "--lora-rank", "16", "--lr", "1e-4", "--num-rollout", str(steps),
               "--rollout-batch-size", "16", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "64",
               "--output", str(out / "run")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=480)
    (out / "run.log").write_text(done.stdout + done.stderr)
    rows = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()] \
        if (out / "run" / "metrics.jsonl").exists() else []
    return {
        "exit_code": done.returncode,
        "steps": len(rows),
        "trust_check_max_diff": [round(r.get("train/sync_logprob_max_diff", -1), 4) for r in rows],
        "weight_versions": [r.get("train/weight_version") for r in rows],
        "sync_seconds": [round(r.get("train/sync_seconds", -1), 3) for r in rows],
        "reward_mean": [round(r.get("rollout/reward_mean", -1), 4) for r in rows],
        "error_tail": (done.stderr or done.stdout)[-600:] if done.returncode else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a Hugging Face folder (real weights)")
    parser.add_argument("--sglang-python", default=sys.executable)
    parser.add_argument("--output", type=Path, default=Path(tempfile.mkdtemp(prefix="sglang-lora-")))
    parser.add_argument("--port", type=int, default=30100)
    parser.add_argument("--steps", type=int, default=4)
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
        report["protocol"] = {name: entry["status"] for name, entry in responses.items() if isinstance(entry, dict)
                              and "status" in entry}
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
        report["run"] = train_against(url, opts.model, opts.output, opts.steps)
        report["passed"] = (
            report["run"]["exit_code"] == 0
            and report["run"]["steps"] == opts.steps
            and report["adapter_vs_peft_max_diff"] < report["adapter_effect_max"] / 4
        )
    except Exception as exc:  # the report says what failed; the log has the rest
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["passed"] = False
    finally:
        server.terminate()
        server.wait(timeout=60)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
