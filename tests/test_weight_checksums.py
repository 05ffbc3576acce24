"""Weight checksums as SGLang 0.5.17's ``/weights_checker`` computes them, the tensors SGLang holds fused, and
``rlsdk serve``'s ``/weights_checker``.

The checksum is held to a word-by-word restatement of SGLang's algorithm here (its kernel needs CUDA) and
to checksums the real SGLang computed on an H200 (``tests/fixtures/sglang-0.5.17-checksums.json``, written
by ``benchmarks/gpu/trust_gpu.py``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
import torch

from rlsdk.engine_api import tensor_checksum
from rlsdk.engines.weight_checksums import tensor_checksums
from rlsdk.engines import weight_checksums
from rlsdk.engines.sglang_client import SGLangClient
from rlsdk.engines.weight_checksums import (
    SGLANG_FUSED,
    engine_names,
    engine_tensors,
    served_checksums,
    sglang_answer,
    sglang_checksums,
)

M32, M64 = 0xFFFFFFFF, (1 << 64) - 1
FIXTURE = Path(__file__).parent / "fixtures" / "sglang-0.5.17-checksums.json"


def reference(tensor: torch.Tensor) -> str:
    """SGLang's tile hash one word at a time, in Python's unbounded integers."""
    data = tensor.contiguous().reshape(-1).view(torch.uint8).tolist()
    data += [0] * (-len(data) % 4)
    words = [int.from_bytes(bytes(data[i : i + 4]), "little") for i in range(0, len(data), 4)]
    if not words:
        return "0" * 16

    def fmix(x: int) -> int:
        x ^= x >> 16
        x = x * 0x85EBCA6B & M32
        x ^= x >> 13
        x = x * 0xC2B2AE35 & M32
        return x ^ (x >> 16)

    def rotl(x: int, r: int) -> int:
        return (x << r | x >> (32 - r)) & M32

    seed = 0x243F6A88
    seed2 = ((seed * 0x9E3779B1) ^ 0xDEADBEEF) & M32
    total = 0
    for tile in range(0, len(words), 8192):
        h1 = h2 = 0
        for i in range(tile, min(tile + 8192, len(words))):
            h1 += fmix(words[i] ^ ((i * 0x27D4EB2D + seed) & M32 ^ rotl(i, 15)))
            h2 += fmix(words[i] ^ ((i * 0x165667B1 + seed2) & M32 ^ rotl(i, 13)))
        h1, h2 = fmix((h1 & M32) ^ (len(words) * 4 & M32)), fmix((h2 & M32) ^ (len(words) * 4 & M32))
        total = (total + (h1 << 32 | h2)) & M64
    total ^= total >> 30
    total = total * 0xBF58476D1CE4E5B9 & M64
    total ^= total >> 27
    total = total * 0x94D049BB133111EB & M64
    return f"{total ^ (total >> 31):016x}"


@pytest.mark.parametrize(
    "tensor",
    [
        torch.zeros(0),
        torch.tensor([1.5], dtype=torch.bfloat16),  # two bytes: one padded word
        torch.arange(5, dtype=torch.uint8),
        torch.randn(3, 7, generator=torch.Generator().manual_seed(0)),
        torch.randn(2 * 8192 + 3, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16),
        torch.randn(8192 + 5, generator=torch.Generator().manual_seed(2)),  # two tiles, the last short
    ],
    ids=["empty", "one-bf16", "five-bytes", "float32", "bf16-three-tiles", "float32-two-tiles"],
)
def test_the_checksum_is_sglangs_algorithm(tensor):
    assert tensor_checksum(tensor) == reference(tensor)


def test_tensors_hashed_together_or_in_pieces_have_their_own_checksums(monkeypatch):
    """Batches of two tiles: a large tensor is hashed in pieces, small ones share a batch."""
    generator = torch.Generator().manual_seed(3)
    tensors = [
        torch.randn(5 * 8192 + 11, generator=generator),
        torch.randn(7, generator=generator).to(torch.bfloat16),
        torch.zeros(0),
        torch.randn(8192, generator=generator),
        torch.arange(3, dtype=torch.uint8),
    ]
    one_by_one = [tensor_checksum(t) for t in tensors]
    monkeypatch.setattr(weight_checksums, "_BATCH", 2 * 8192)
    assert tensor_checksums(tensors) == one_by_one == [reference(t) for t in tensors]


def test_one_changed_bit_changes_the_checksum():
    tensor = torch.randn(64, 64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    changed = tensor.clone()
    changed.view(torch.int16)[17, 3] ^= 1
    assert tensor_checksum(changed) != tensor_checksum(tensor)


@pytest.mark.skipif(
    not FIXTURE.is_file(), reason="recorded on the GPU machine by benchmarks/gpu/trust_gpu.py"
)
def test_checksums_equal_those_the_real_sglang_computed():
    """Tensors of 32-bit words from a fixed LCG, hashed on an H200 by SGLang's own kernel."""
    for case in json.loads(FIXTURE.read_text())["cases"]:
        words = torch.tensor(
            [(i * 2654435761 + 12345) % 2**32 for i in range(case["words"])], dtype=torch.int64
        )
        tensor = words.to(torch.int32).view(getattr(torch, case["dtype"]))
        assert tensor_checksum(tensor) == case["sglang"], case


LLAMA = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.k_proj.weight",
    "model.layers.0.self_attn.v_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.mlp.gate_proj.weight",
    "model.layers.0.mlp.up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.norm.weight",
]


def test_sglang_holds_attention_and_the_gated_unit_fused_in_order():
    held = engine_names(list(reversed(LLAMA)), SGLANG_FUSED)
    assert held["model.layers.0.self_attn.qkv_proj.weight"] == LLAMA[1:4]
    assert held["model.layers.0.mlp.gate_up_proj.weight"] == LLAMA[5:7]
    assert set(held) == {
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.qkv_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.norm.weight",
    }
    assert engine_names(LLAMA, {}) == {name: [name] for name in LLAMA}


def test_a_fusion_missing_a_part_is_not_made_up():
    held = engine_names(["model.layers.0.mlp.gate_proj.weight"], SGLANG_FUSED)
    assert held == {}


def test_tied_tensors_count_once_and_fused_ones_are_concatenated_rows():
    embed = torch.randn(4, 2)
    q, k, v = torch.ones(2, 2), torch.zeros(1, 2), torch.full((1, 2), 2.0)
    state = {
        "model.embed_tokens.weight": embed,
        "lm_head.weight": embed,
        "model.layers.0.self_attn.q_proj.weight": q,
        "model.layers.0.self_attn.k_proj.weight": k,
        "model.layers.0.self_attn.v_proj.weight": v,
    }
    held = engine_tensors(state, SGLANG_FUSED)
    assert set(held) == {"model.embed_tokens.weight", "model.layers.0.self_attn.qkv_proj.weight"}
    assert torch.equal(held["model.layers.0.self_attn.qkv_proj.weight"][0], torch.cat([q, k, v]))


def test_a_float32_tensor_may_be_served_in_half_precision():
    tensor = torch.randn(8, generator=torch.Generator().manual_seed(5))
    assert served_checksums([tensor, tensor.bfloat16()]) == [
        {tensor_checksum(tensor), tensor_checksum(tensor.bfloat16()), tensor_checksum(tensor.half())},
        {tensor_checksum(tensor.bfloat16())},
    ]


def test_sglangs_answer_is_read_per_rank_and_a_sharded_rank_says_so():
    answer = sglang_answer([{"a": "0" * 16}])
    [served] = sglang_checksums(answer, "http://x", SGLANG_FUSED)
    assert (served.holder, served.checksums, served.tp_size) == ("http://x", {"a": "0" * 16}, 1)
    answer["ranks"][0]["parallelism_info"].update(tp_rank=1, tp_size=2)
    assert sglang_checksums(answer, "http://x", {})[0].holder == "http://x (tensor-parallel rank 1 of 2)"
    with pytest.raises(ValueError, match="no 'ranks' list"):
        sglang_checksums({"success": True}, "http://x", {})


@pytest.mark.plugins("rlsdk_embedded")
def test_rlsdk_serve_answers_weights_checker_as_sglang_and_the_client_reads_it(tiny_llama):
    """The embedded engine served over real HTTP: checksum of every weight by Hugging Face name; the other
    actions (which copy or overwrite the served weights) are refused."""
    from rlsdk.run.engine_server import start_server
    from rlsdk_embedded.engine import EmbeddedEngine

    async def ask() -> tuple[dict, int, list]:
        engine = EmbeddedEngine(str(tiny_llama), threads=1)
        await engine.start()
        handle = await start_server(engine, port=0)
        try:
            async with httpx.AsyncClient() as http:
                answer = (await http.post(f"{handle.url}/weights_checker", json={})).json()
                refused = await http.post(f"{handle.url}/weights_checker", json={"action": "reset_tensors"})
            served = await SGLangClient(handle.url).weight_checksums()
            return answer, refused.status_code, served or []
        finally:
            await handle.close()
            await engine.close()

    answer, refused, served = asyncio.run(ask())
    assert answer["success"] and refused == 400
    [rank] = answer["ranks"]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    assert rank["checksums"] == {name: tensor_checksum(t) for name, t in model.state_dict().items()}
    assert rank["parallelism_info"]["tp_size"] == 1
    assert [s.checksums for s in served] == [rank["checksums"]]
