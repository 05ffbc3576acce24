"""SGLang's LoRA endpoints on ``rlsdk serve``'s server with the embedded engine (the tiny Llama of
conftest.py): an adapter folder loads by path only from inside an allowed folder, merges exactly (its
log-probs are peft's), is named per request in ``lora_path``, and unloads; the answers have the shape of a
real SGLang 0.5.17's (``fixtures/sglang-0.5.17-lora.json``), which the SGLang client reads."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import httpx
import pytest
import torch

from rlsdk.engine_api import EngineError, EngineRequestError, SGLangClient
from rlsdk.testing import ServedEngine
from rlsdk.testing_engine import random_lora

pytestmark = pytest.mark.plugins("rlsdk_embedded")

LORA_FACTS = json.loads((Path(__file__).parent / "fixtures" / "sglang-0.5.17-lora.json").read_text())
PROBE = {
    "input_ids": [2, 3, 4, 5, 6],
    "return_logprob": True,
    "logprob_start_len": 2,
    "sampling_params": {"max_new_tokens": 0, "temperature": 1.0},
}


def adapter_folder(tiny_llama: Path, folder: Path) -> tuple[Path, list[float]]:
    """A random (non-zero) rank-4 adapter on the attention projections, saved in PEFT's format, and peft's
    own log-probs of the probe's tokens 3.. with it."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    peft_model = random_lora(AutoModelForCausalLM.from_pretrained(tiny_llama), folder)
    with torch.no_grad():
        ids = torch.tensor([PROBE["input_ids"]])
        logits = peft_model(input_ids=ids).logits[0, :-1]
        picked = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
    return folder, picked.tolist()[2:]


def scored(url: str, **extra) -> httpx.Response:
    return httpx.post(f"{url}/generate", json={**PROBE, **extra}, timeout=60)


@pytest.fixture
def served(tiny_llama, tmp_path):
    from rlsdk_embedded.engine import EmbeddedEngine

    (tmp_path / "allowed").mkdir()
    with ServedEngine(
        EmbeddedEngine(str(tiny_llama), device="cpu", threads=1), weights_dirs=[tmp_path / "allowed"]
    ) as running:
        yield running


def test_an_adapter_loads_merges_exactly_and_unloads(tiny_llama, tmp_path, served):
    folder, expected = adapter_folder(tiny_llama, tmp_path / "allowed" / "adapter")
    base = [e[0] for e in scored(served.url).json()["meta_info"]["input_token_logprobs"][1:]]
    answer = httpx.post(f"{served.url}/load_lora_adapter", json={"lora_name": "a1", "lora_path": str(folder)})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "rid": None,
        "http_worker_ipc": None,
        "success": True,
        "error_message": "",
        "loaded_adapters": {"a1": str(folder)},
    }
    merged = [
        e[0] for e in scored(served.url, lora_path="a1").json()["meta_info"]["input_token_logprobs"][1:]
    ]
    assert max(abs(a - b) for a, b in zip(merged, expected, strict=True)) < 1e-4
    assert max(abs(a - b) for a, b in zip(base, expected, strict=True)) > 1e-2  # the adapter matters

    other = scored(served.url, lora_path="a2")
    assert other.status_code == 400 and "never been loaded: a2" in other.json()["error"]["message"]
    again = httpx.post(f"{served.url}/load_lora_adapter", json={"lora_name": "a1", "lora_path": str(folder)})
    assert again.status_code == 400 and "already loaded" in again.json()["error_message"]

    version = httpx.post(f"{served.url}/update_weight_version", json={"new_version": "lora-1"})
    assert (
        version.json()["success"]
        and httpx.get(f"{served.url}/model_info").json()["weight_version"] == "lora-1"
    )

    gone = httpx.post(f"{served.url}/unload_lora_adapter", json={"lora_name": "a1"})
    assert gone.status_code == 200 and gone.json()["loaded_adapters"] == {}
    after = [e[0] for e in scored(served.url).json()["meta_info"]["input_token_logprobs"][1:]]
    assert max(abs(a - b) for a, b in zip(after, base, strict=True)) < 1e-5  # the base weights are back
    unknown = httpx.post(f"{served.url}/unload_lora_adapter", json={"lora_name": "a1"})
    assert unknown.status_code == 400 and unknown.json()["success"] is False


def test_a_request_never_makes_the_server_read_outside_the_allowed_folders(tiny_llama, tmp_path, served):
    """A path outside, a link inside that points outside (the folder or one of its files), and a server
    allowing no folder: each refused with 403 before anything is read."""
    outside, _ = adapter_folder(tiny_llama, tmp_path / "outside")
    linked = tmp_path / "allowed" / "linked"
    os.symlink(outside, linked)
    sneaky = tmp_path / "allowed" / "sneaky"
    sneaky.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        os.symlink(outside / name, sneaky / name)
    for path in (outside, linked, sneaky, tmp_path / "allowed" / ".." / "outside"):
        answer = httpx.post(
            f"{served.url}/load_lora_adapter", json={"lora_name": "x", "lora_path": str(path)}
        )
        assert answer.status_code == 403, path
        assert answer.json()["success"] is False and "is not inside" in answer.json()["error_message"]
    assert served.engine.lora_adapters == {}
    bad = httpx.post(f"{served.url}/load_lora_adapter", json={"lora_name": 3, "lora_path": str(outside)})
    assert bad.status_code == 400


def test_with_no_allowed_folder_adapters_do_not_load_over_http(tiny_llama, tmp_path):
    from rlsdk_embedded.engine import EmbeddedEngine

    folder, _ = adapter_folder(tiny_llama, tmp_path / "adapter")
    with ServedEngine(EmbeddedEngine(str(tiny_llama), device="cpu", threads=1)) as served:
        answer = httpx.post(
            f"{served.url}/load_lora_adapter", json={"lora_name": "x", "lora_path": str(folder)}
        )
        assert (
            answer.status_code == 403 and "loading weights over HTTP is off" in answer.json()["error_message"]
        )


def test_an_adapter_of_a_tied_output_head_changes_the_head_alone(tiny_llama, tmp_path, served):
    """The tiny Llama ties its output head to its embeddings: the engine gives the head storage of its own
    before merging an adapter of it, so the embeddings keep their values and the log-probs are peft's."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(5)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_llama),
        LoraConfig(r=2, target_modules=["lm_head"], init_lora_weights=False),
    )
    model.save_pretrained(tmp_path / "allowed" / "head", save_embedding_layers=False)
    with torch.no_grad():
        ids = torch.tensor([PROBE["input_ids"]])
        logits = model(input_ids=ids).logits[0, :-1]
        expected = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0].tolist()[2:]
    answer = httpx.post(
        f"{served.url}/load_lora_adapter",
        json={"lora_name": "h", "lora_path": str(tmp_path / "allowed" / "head")},
    )
    assert answer.status_code == 200, answer.text
    served_logprobs = [e[0] for e in scored(served.url).json()["meta_info"]["input_token_logprobs"][1:]]
    assert served_logprobs == pytest.approx(expected, abs=1e-5)


def test_the_lora_answers_have_the_shape_of_sglang_0_5_17s(tiny_llama, tmp_path, served):
    """Each call's status, keys (in order) and JSON types as the real server's, which sends an empty
    ``error_message`` on success, a null ``loaded_adapters`` for a failed unload, and ``{"error":
    {"message"}}`` for a ``/generate`` naming an adapter never loaded."""
    folder, _ = adapter_folder(tiny_llama, tmp_path / "allowed" / "adapter")

    def call(path, body):
        return httpx.post(f"{served.url}{path}", json=body, timeout=60)

    answers = {
        "load": call("/load_lora_adapter", {"lora_name": "probe", "lora_path": str(folder)}),
        "load_same_name": call("/load_lora_adapter", {"lora_name": "probe", "lora_path": str(folder)}),
        "generate_unknown_lora": scored(served.url, lora_path="nope"),
        "unload": call("/unload_lora_adapter", {"lora_name": "probe"}),
        "unload_unknown": call("/unload_lora_adapter", {"lora_name": "probe"}),
    }
    for name, answer in answers.items():
        theirs = LORA_FACTS[name]["body"]
        assert answer.status_code == LORA_FACTS[name]["status"], name
        ours = answer.json()
        assert list(ours) == list(theirs), name
        assert [type(v) for v in ours.values()] == [type(v) for v in theirs.values()], name
    assert answers["load"].json()["error_message"] == ""
    assert "already loaded" in answers["load_same_name"].json()["error_message"]
    assert (
        answers["generate_unknown_lora"]
        .json()["error"]["message"]
        .startswith("Got LoRA adapter that has never been loaded: nope")
    )


def test_the_sglang_client_reads_a_real_servers_lora_answers():
    """SGLang needs a GPU: this stand-in answers the LoRA calls with the bodies a real 0.5.17 server sent."""
    from aiohttp import web

    def answer(key):
        async def handler(request):
            return web.json_response(LORA_FACTS[key]["body"], status=LORA_FACTS[key]["status"])

        return handler

    async def scenario():
        app = web.Application()
        app.add_routes([web.post("/load_lora_adapter", answer("load")),
                        web.post("/unload_lora_adapter", answer("unload_unknown")),
                        web.post("/generate", answer("generate_unknown_lora"))])  # fmt: skip
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        client = SGLangClient(f"http://127.0.0.1:{runner.addresses[0][1]}")
        try:
            await client.load_lora_adapter("probe", "/adapters/probe")
            named = client.lora_name
            with pytest.raises(EngineError, match="LoRA with name probe does not exist"):
                await client.unload_lora_adapter("probe")
            with pytest.raises(EngineRequestError, match="never been loaded: nope"):
                await client.generate({"input_ids": [1, 2], "lora_path": "nope"})
            return named
        finally:
            await client.close()
            await runner.cleanup()

    assert asyncio.run(scenario()) == "probe"
