"""The vllm engine against a real vLLM 0.26 (not run in CI: it needs the GPU machine; one device call of under 10
minutes; the last line printed is one JSON object).

rlsdk's vllm engine launches vLLM (``--vllm-python``) on random float32 weights of the bench model, colocated
(sleep mode, the IPC weight transfer) and with LoRA enabled, then:

1. **Captures vLLM's answers** to the cases of ``tests/fixtures/vllm-0.26.0-{completions,control,lora}.json``
   (those files were restated from vLLM's source without a GPU) and writes the three files, in the same
   layout, into ``--output``: copy them over the restated ones, and the CPU tests then hold the client and
   the stand-in to the real shapes. The cases a running server cannot give here are listed under
   ``not_captured`` and kept from the restated files (a server without the RL routes or without a weight
   transfer backend).
2. **Runs the engine contract** (:data:`rlsdk.testing.ENGINE_CONTRACT`, the 19 checks the CPU suite runs
   against the stand-in) against the real server, the torch trainer on the same GPU in float32 holding the
   same weights; log-probs compared within ``--tolerance`` nats (float32 kernels of two libraries).

    PYTHONPATH=/tmp/rl:benchmarks/gpu python3 benchmarks/gpu/vllm_checks.py --model-config .gpu/bench-model \\
        --vllm-python /tmp/vllm-python --output /tmp/gpu-results/vllm-fixtures

On a CPU, ``--device cpu --tolerance 0.001`` with the stand-in launched as ``vllm serve`` (a ``--vllm-python``
script running ``plugins/engine_vllm/tests/fake_vllm_interpreter.py`` with ``FAKE_VLLM_GENERATE=1``) and a
small model's folder as ``--model-config`` (``rlsdk.testing.tiny_llama``'s) runs the whole script in about 30
seconds: it checks the script, not vLLM (19 of 19 checks passed, 2026-11-29; its fixtures differ from a real
server's where the stand-in says it does: no top-k log-probs, no ``allowed_token_ids``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import traceback
from datetime import date
from pathlib import Path
from typing import Any

from workload import machine, random_checkpoint, run_reporting, started_vllm

from rlsdk import RolloutConfig

ROOT = Path(__file__).resolve().parents[2]
RESTATED = {name: ROOT / "tests" / "fixtures" / f"vllm-0.26.0-{name}.json" for name in ("completions", "control", "lora")}
PROMPT = [1, 504, 3458, 30]
"""The captured requests' prompt (each id modulo the vocabulary: a small model's folder works too)."""
REFUSED = {
    "retract": "vLLM 0.26 cannot pause with mode 'retract'",
    "image": "key 'image_data' has no vLLM 0.26 equivalent",
    "n": r"sampling parameter 'n' has no vLLM 0.26 equivalent here \(n > 1",
}


class Server:
    """Plain HTTP to the launched server's socket: every answer as ``[status, body]`` (JSON where it is)."""

    def __init__(self, socket: str, key: str) -> None:
        self.socket, self.key = socket, key

    async def __aenter__(self) -> Server:
        import aiohttp

        connector = aiohttp.UnixConnector(path=self.socket)
        self.http = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.close()

    async def call(self, method: str, path: str, body: Any = None, auth: bool = True) -> list[Any]:
        headers = {"Authorization": f"Bearer {self.key}"} if auth else {}
        async with self.http.request(method, f"http://localhost{path}", json=body, headers=headers) as answer:
            text = await answer.text()
        try:
            return [answer.status, json.loads(text)]
        except ValueError:
            return [answer.status, text]

    async def stream(self, body: dict[str, Any]) -> list[str]:
        headers = {"Authorization": f"Bearer {self.key}"}
        async with self.http.post("http://localhost/v1/completions", json=body, headers=headers) as answer:
            return [line.strip() for line in (await answer.text()).splitlines() if line.strip()]


async def capture_completions(server: Server, eos: int, tokenizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The completions cases (and the ``/abort_requests`` answer, a control case, taken on the way)."""
    prompt = [t % len(tokenizer) for t in PROMPT]
    base = {"prompt": prompt, "return_token_ids": True, "temperature": 0.0, "logprobs": 0}
    out: dict[str, Any] = {}
    out["single"] = await server.call(
        "POST", "/v1/completions", {**base, "max_tokens": 6, "ignore_eos": True, "request_id": "single"}
    )
    greedy = out["single"][1]["choices"][0]["token_ids"]
    out["stop_eos"] = await server.call(
        "POST", "/v1/completions", {**base, "max_tokens": 3, "allowed_token_ids": [eos], "request_id": "eos"}
    )
    out["stop_token"] = await server.call(
        "POST", "/v1/completions", {**base, "max_tokens": 6, "stop_token_ids": [greedy[1]], "request_id": "stoptok"}
    )
    stop_text = tokenizer.decode([greedy[1]])
    out["stop_string"] = await server.call(
        "POST", "/v1/completions", {**base, "max_tokens": 6, "stop": [stop_text], "request_id": "stopstr"}
    )
    out["top_logprobs"] = await server.call(
        "POST",
        "/v1/completions",
        {**base, "max_tokens": 2, "logprobs": 2, "return_tokens_as_token_ids": True, "request_id": "top"},
    )
    out["prompt_logprobs"] = await server.call(
        "POST", "/v1/completions", {**base, "max_tokens": 1, "prompt_logprobs": 0, "request_id": "score"}
    )
    long = {**base, "max_tokens": 2000, "ignore_eos": True, "request_id": "abort-me"}
    running = asyncio.ensure_future(server.call("POST", "/v1/completions", long))
    await asyncio.sleep(0.5)
    abort_call = await server.call("POST", "/abort_requests", {"request_ids": ["cmpl-abort-me-0"]})
    out["aborted"] = await running
    out["stream"] = await server.stream({**base, "max_tokens": 3, "ignore_eos": True, "stream": True, "request_id": "stream"})
    out["bad_request"] = await server.call("POST", "/v1/completions", {**base, "prompt": [-1], "max_tokens": 2})
    out["unknown_model"] = await server.call("POST", "/v1/completions", {**base, "max_tokens": 2, "model": "no-such-adapter"})
    out["unauthorized"] = await server.call("GET", "/v1/models", auth=False)
    return out, {"abort_requests": abort_call}


async def capture_control(server: Server, folder: Path, trainer: Any, prompt: list[int]) -> dict[str, Any]:
    """The RL routes' answers; the server ends as it began (awake, its weights those of ``folder``)."""
    from rlsdk.engine_api import FlatWeights
    from rlsdk_engine_vllm.transfer import ipc_update_info

    out: dict[str, Any] = {}
    out["health"] = await server.call("GET", "/health")
    out["version"] = await server.call("GET", "/version")
    out["models"] = await server.call("GET", "/v1/models")
    out["is_paused"] = await server.call("GET", "/is_paused")
    out["pause"] = await server.call("POST", "/pause?mode=abort")
    out["resume"] = await server.call("POST", "/resume")
    out["pause_bad_mode"] = await server.call("POST", "/pause?mode=retract")
    out["reset_prefix_cache"] = await server.call("POST", "/reset_prefix_cache")
    long = {"prompt": prompt, "max_tokens": 2000, "ignore_eos": True, "request_id": "busy"}
    running = asyncio.ensure_future(server.call("POST", "/v1/completions", long))
    await asyncio.sleep(0.5)
    out["reset_prefix_cache_busy"] = await server.call("POST", "/reset_prefix_cache")
    status, text = await server.call("GET", "/metrics")  # while the request runs: the load is not zero
    shown = [line for line in str(text).splitlines() if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting"))]
    out["metrics"] = [status, "\n".join(shown) + "\n"]
    await server.call("POST", "/abort_requests", {"request_ids": ["cmpl-busy-0"]})
    await running
    out["sleep"] = await server.call("POST", "/sleep?level=2&mode=abort")
    out["is_sleeping"] = await server.call("GET", "/is_sleeping")
    out["wake_up"] = await server.call("POST", "/wake_up?tags=weights")
    await server.call("POST", "/wake_up?tags=kv_cache")
    out["collective_rpc_reload_weights"] = await server.call(
        "POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
    )  # the weights a level-2 sleep dropped come back from disk
    out["collective_rpc_missing_method"] = await server.call("POST", "/collective_rpc", {})
    out["collective_rpc_unknown_method"] = await server.call("POST", "/collective_rpc", {"method": "no_such_method"})
    out["rlsdk_weight_checksums"] = await server.call("POST", "/collective_rpc", {"method": "rlsdk_weight_checksums"})
    out["get_world_size"] = await server.call("GET", "/get_world_size")
    out["init_weight_transfer_engine"] = await server.call("POST", "/init_weight_transfer_engine", {"init_info": {}})
    await server.call("POST", "/pause?mode=keep")
    out["start_weight_update"] = await server.call("POST", "/start_weight_update")
    name = "model.embed_tokens.weight"
    bucket = FlatWeights.pack([(name, trainer.model.state_dict()[name].detach())])
    out["update_weights"] = await server.call("POST", "/update_weights", {"update_info": ipc_update_info(bucket)})
    out["finish_weight_update"] = await server.call("POST", "/finish_weight_update")
    await server.call("POST", "/resume")
    return out


async def capture_lora(server: Server, adapter: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    load = {"lora_name": "rlsdk_v1", "lora_path": str(adapter)}
    out["load"] = await server.call("POST", "/v1/load_lora_adapter", load)
    out["models_with_adapter"] = await server.call("GET", "/v1/models")
    out["load_again"] = await server.call("POST", "/v1/load_lora_adapter", load)
    out["load_missing_fields"] = await server.call("POST", "/v1/load_lora_adapter", {"lora_name": "rlsdk_v1"})
    out["unload"] = await server.call("POST", "/v1/unload_lora_adapter", {"lora_name": "rlsdk_v1"})
    out["unload_missing"] = await server.call("POST", "/v1/unload_lora_adapter", {"lora_name": "rlsdk_v1"})
    return out


def random_adapter(folder: Path, out: Path) -> Path:
    """A random rank-16 PEFT adapter on the attention projections of the model in ``folder``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_pretrained(folder)
    peft_model = get_peft_model(
        model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    peft_model.save_pretrained(str(out))
    return out


def write_fixtures(captured: dict[str, dict[str, Any]], output: Path) -> dict[str, list[str]]:
    """Each file as the restated one, its cases replaced by the captured ones; returns the cases kept restated."""
    output.mkdir(parents=True, exist_ok=True)
    kept: dict[str, list[str]] = {}
    for name, path in RESTATED.items():
        restated = json.loads(path.read_text())
        kept[name] = [case for case in restated if case != "_about" and case not in captured[name]]
        about = (
            f"Captured from a real vLLM 0.26.0 server by benchmarks/gpu/vllm_checks.py on {date.today()} "
            f"({machine().get('card') or 'no GPU'}), launched by rlsdk's vllm engine on random float32 weights of "
            f"the bench model. Not captured here, kept as restated from vLLM's source: {kept[name] or 'none'}."
        )
        merged = {"_about": about, **{k: captured[name].get(k, v) for k, v in restated.items() if k != "_about"}}
        (output / path.name).write_text(json.dumps(merged, indent=1) + "\n")
    return kept


def run_contract(socket: str, key: str, folder: Path, trainer: Any, work: Path, tolerance: float) -> dict[str, str]:
    from rlsdk.testing import ENGINE_CONTRACT, EngineKit, check_engine_contract
    from rlsdk_engine_vllm.client import VLLMClient

    os.environ["VLLM_API_KEY"] = key  # the clients the checks make send it
    kit = EngineKit(model=folder, trainer=trainer, work=work, serves={"tensor", "release"}, rejects=dict(REFUSED),
                    tolerance=tolerance)
    results = {}
    for name in ENGINE_CONTRACT:
        started = time.perf_counter()
        try:
            reason = check_engine_contract(name, lambda: VLLMClient(socket=socket), kit, timeout=300)
            results[name] = f"skipped: {reason}" if reason else "passed"
        except Exception as exc:  # noqa: BLE001 (every check's outcome is reported)
            results[name] = "failed: " + "".join(traceback.format_exception_only(exc)).strip()[:600]
        results[name] += f" ({time.perf_counter() - started:.1f}s)"
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-config", default=".gpu/bench-model")
    parser.add_argument("--vllm-python", default="/tmp/vllm-python")
    parser.add_argument("--output", type=Path, default=Path("/tmp/gpu-results/vllm-fixtures"))
    parser.add_argument("--mem-fraction", type=float, default=0.5)
    parser.add_argument("--startup-timeout", type=float, default=400.0)
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script against the stand-in")
    parser.add_argument("--tolerance", type=float, default=0.02, help="nats: vLLM's float32 log-probs vs the trainer's")
    opts = parser.parse_args()
    opts.model_config = Path(opts.model_config).resolve()

    import torch
    from transformers import AutoTokenizer

    from rlsdk.runtime import BackgroundLoop
    from rlsdk.trainer_api import TorchTrainer

    work = Path(tempfile.mkdtemp(prefix="vllm-checks-"))
    folder = random_checkpoint(opts.model_config, work / "weights", dtype="float32", device=opts.device)
    adapter = random_adapter(folder, work / "adapter")
    if opts.device.startswith("cuda"):
        torch.cuda.empty_cache()
    args = RolloutConfig(
        engine="vllm",
        hf_checkpoint=str(folder),
        train=True,
        colocate=True,
        weight_sync="tensor",
        lora_rank=16,
        train_device=opts.device,
        train_dtype="float32",
        vllm_python=opts.vllm_python,
        vllm_args=f"--dtype float32 --enforce-eager --max-model-len 4096 --gpu-memory-utilization {opts.mem_fraction}",
        vllm_startup_timeout=opts.startup_timeout,
        output_dir=str(work / "run"),
    )
    loop = BackgroundLoop()
    client, started = started_vllm(args, loop)
    report: dict[str, Any] = {"benchmark": "vllm_checks", **started}
    socket, key = client.launcher.socket, client.launcher.api_key
    try:
        # the trainer holds the served weights whole (no adapter of its own): the contract's truth
        trainer = TorchTrainer(
            RolloutConfig(hf_checkpoint=str(folder), train=True, train_device=opts.device, train_dtype="float32")
        )
        tokenizer = AutoTokenizer.from_pretrained(folder)

        async def capture() -> dict[str, dict[str, Any]]:
            async with Server(socket, key) as server:
                completions, from_completions = await capture_completions(server, tokenizer.eos_token_id, tokenizer)
                prompt = [t % len(tokenizer) for t in PROMPT]
                control = {**from_completions, **await capture_control(server, folder, trainer, prompt)}
                lora = await capture_lora(server, adapter)
            return {"completions": completions, "control": control, "lora": lora}

        captured = asyncio.run(capture())
        report["not_captured"] = write_fixtures(captured, opts.output)
        report["fixtures"] = str(opts.output)
        report["contract"] = run_contract(socket, key, folder, trainer, work / "kit", opts.tolerance)
    finally:
        loop.run(client.close())
    outcomes = [result.split(":")[0].split(" ")[0] for result in report["contract"].values()]
    report.update({kind: outcomes.count(kind) for kind in ("passed", "skipped", "failed")})
    report["inputs"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(opts).items()}
    report["machine"] = machine()
    print(json.dumps(report))


if __name__ == "__main__":
    run_reporting(main, "vllm_checks")
