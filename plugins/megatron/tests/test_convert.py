"""Hugging Face <-> megatron-core conversion on tiny real transformers models (megatron-core itself
ships only cp312 CUDA wheels, so these tests need neither: the conversion is plain torch)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlsdk import load_callable

from rlsdk_megatron.convert import (
    in_pipeline_stage,
    ModelShape,
    check_expert_parallel,
    check_pipeline_parallel,
    check_tensor_parallel,
    fuse_qkv,
    hf_to_megatron,
    megatron_config,
    megatron_to_hf,
    merge_expert_parallel,
    merge_pipeline_parallel,
    merge_tensor_parallel,
    pad_vocab,
    padded_vocab_size,
    split_expert_parallel,
    split_pipeline_parallel,
    split_tensor_parallel,
)

TINY = load_callable(f"{Path(__file__).with_name('cpu_megatron.py')}:tiny_llama")(
    hidden_size=32, intermediate_size=48, vocab_size=64, max_position_embeddings=128, rope_theta=100000.0
)


def tiny_model(model_type: str, tied: bool) -> tuple[dict, dict]:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = {**TINY, "model_type": model_type, "tie_word_embeddings": tied}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    return model.state_dict(), config


@pytest.mark.parametrize(("model_type", "tied"), [("llama", True), ("llama", False), ("qwen2", False)])
def test_round_trip_keeps_every_name_and_tensor(model_type, tied):
    hf, config = tiny_model(model_type, tied)
    megatron = hf_to_megatron(hf, config)
    layer = "decoder.layers.1."
    expected = {
        "input_layernorm.weight",
        "self_attention.linear_qkv.weight",
        "self_attention.linear_proj.weight",
        "pre_mlp_layernorm.weight",
        "mlp.linear_fc1.weight",
        "mlp.linear_fc2.weight",
    }
    if model_type == "qwen2":
        expected.add("self_attention.linear_qkv.bias")
    assert {k.removeprefix(layer) for k in megatron if k.startswith(layer)} == expected
    assert ("output_layer.weight" in megatron) is not tied
    assert megatron[layer + "self_attention.linear_qkv.weight"].shape == (4 * 8 + 2 * 2 * 8, 32)
    assert megatron[layer + "mlp.linear_fc1.weight"].shape == (2 * 48, 32)
    back = megatron_to_hf({**megatron, layer + "self_attention.linear_qkv._extra_state": None}, config)
    assert back.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


def test_qkv_is_grouped_per_query_group_and_fc1_is_gate_then_up():
    shape = ModelShape(
        num_layers=1, hidden_size=2, num_heads=4, num_groups=2, head_dim=1, tied=False, qkv_bias=False
    )
    q = torch.tensor([[10.0], [11.0], [12.0], [13.0]])  # heads 0,1 in group 0; heads 2,3 in group 1
    k = torch.tensor([[20.0], [21.0]])
    v = torch.tensor([[30.0], [31.0]])
    assert fuse_qkv(q, k, v, shape).flatten().tolist() == [10, 11, 20, 30, 12, 13, 21, 31]
    hf, config = tiny_model("llama", False)
    fc1 = hf_to_megatron(hf, config)["decoder.layers.0.mlp.linear_fc1.weight"]
    assert torch.equal(fc1[:48], hf["model.layers.0.mlp.gate_proj.weight"])
    assert torch.equal(fc1[48:], hf["model.layers.0.mlp.up_proj.weight"])


def test_config_mapping_for_llama_and_qwen2():
    _, config = tiny_model("llama", True)
    transformer, gpt = megatron_config({**config, "head_dim": 8})
    assert transformer["num_query_groups"] == 2 and transformer["kv_channels"] == 8
    assert transformer["ffn_hidden_size"] == 48 and transformer["normalization"] == "RMSNorm"
    assert transformer["activation_func"] is torch.nn.functional.silu
    assert (
        transformer["gated_linear_unit"]
        and not transformer["add_bias_linear"]
        and not transformer["add_qkv_bias"]
    )
    assert gpt == {
        "vocab_size": 64,
        "max_sequence_length": 128,
        "position_embedding_type": "rope",
        "rotary_base": 100000,
        "rotary_percent": 1.0,
        "share_embeddings_and_output_weights": True,
        "parallel_output": False,
    }
    assert megatron_config({**config, "model_type": "qwen2"})[0]["add_qkv_bias"]
    with pytest.raises(ValueError, match="not 'gpt2'"):
        megatron_config({**config, "model_type": "gpt2"})
    with pytest.raises(ValueError, match="rope_scaling"):
        megatron_config({**config, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})


def test_rope_base_from_a_transformers_5_config():
    """transformers 5 saves ``rope_parameters`` instead of ``rope_theta`` (SmolLM2 converted from its GGUF
    has base 100000): the base must come from there, not fall back to 10000."""
    _, config = tiny_model("llama", True)
    del config["rope_theta"]
    saved = {**config, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}
    assert megatron_config(saved)[1]["rotary_base"] == 100000
    with pytest.raises(ValueError, match="default rope only"):
        megatron_config(
            {**config, "rope_parameters": {"rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0}}
        )


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize(("model_type", "tied"), [("llama", True), ("qwen2", False)])
def test_tensor_parallel_split_then_merge_is_the_identity(model_type, tied, tp):
    hf, config = tiny_model(model_type, tied)
    whole = hf_to_megatron(hf, config)
    shards = split_tensor_parallel(whole, tp)
    assert len(shards) == tp and all(shard.keys() == whole.keys() for shard in shards)
    merged = merge_tensor_parallel(shards)
    assert merged.keys() == whole.keys()
    for name, tensor in whole.items():
        assert torch.equal(merged[name], tensor), name


def test_tensor_parallel_shards_follow_megatrons_layers():
    """Rank r's qkv rows are its query groups whole; fc1 is [gate_r; up_r]; proj and fc2 split columns;
    the embedding and output layer split vocabulary rows; norms are replicated. (Shapes against a real
    TP=2 ``GPTModel``: test_megatron_parallel.py.)"""
    hf, config = tiny_model("qwen2", False)  # 4 heads in 2 query groups of head_dim 8, qkv bias
    whole = hf_to_megatron(hf, config)
    first, second = split_tensor_parallel(whole, 2)
    layer = "decoder.layers.0."
    group_rows = (2 + 2) * 8  # a group's 2 query heads, its key head, its value head
    qkv = whole[layer + "self_attention.linear_qkv.weight"]
    assert torch.equal(second[layer + "self_attention.linear_qkv.weight"], qkv[group_rows:])
    assert torch.equal(
        first[layer + "self_attention.linear_qkv.bias"],
        whole[layer + "self_attention.linear_qkv.bias"][:group_rows],
    )
    gate, up = hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(second[layer + "mlp.linear_fc1.weight"], torch.cat([gate[24:], up[24:]]))
    assert torch.equal(first[layer + "mlp.linear_fc2.weight"], whole[layer + "mlp.linear_fc2.weight"][:, :24])
    assert first[layer + "self_attention.linear_proj.weight"].shape == (32, 16)
    assert first["embedding.word_embeddings.weight"].shape == first["output_layer.weight"].shape == (32, 32)
    assert first[layer + "input_layernorm.weight"] is second[layer + "input_layernorm.weight"]


def test_vocabulary_padded_for_tensor_parallelism_and_cut_back():
    hf, config = tiny_model("llama", False)
    whole = hf_to_megatron(hf, {**config})
    assert (
        padded_vocab_size(64, 2) == 64 and padded_vocab_size(63, 2) == 64 and padded_vocab_size(61, 4) == 64
    )
    odd = {**whole, "embedding.word_embeddings.weight": whole["embedding.word_embeddings.weight"][:63]}
    padded = pad_vocab(odd, padded_vocab_size(63, 2))
    assert padded["embedding.word_embeddings.weight"].shape[0] == padded["output_layer.weight"].shape[0] == 64
    assert not padded["embedding.word_embeddings.weight"][63:].any()
    back = pad_vocab(merge_tensor_parallel(split_tensor_parallel(padded, 2)), 63)
    assert torch.equal(back["embedding.word_embeddings.weight"], odd["embedding.word_embeddings.weight"])
    assert back["output_layer.weight"].shape[0] == 63


def test_tensor_parallel_sizes_that_do_not_divide_the_model_are_refused():
    _, config = tiny_model("llama", False)  # 4 heads, 2 query groups, 48 MLP columns
    check_tensor_parallel(config, 2)
    with pytest.raises(ValueError, match="size 4 does not divide the 2 query groups"):
        check_tensor_parallel(config, 4)
    with pytest.raises(ValueError, match="size 3 does not divide the 4 attention heads"):
        check_tensor_parallel(config, 3)


MOE = {"moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2, "head_dim": 8}


def tiny_qwen3(model_type: str, fused: bool = False) -> tuple[dict, dict, dict]:
    """A tiny Qwen3 (QK-norm) or Qwen3-MoE model: (its state dict, its config.json as saved, the state
    dict ``save_pretrained`` wrote, which holds one matrix per expert where transformers 5's model fuses
    them)."""
    import json
    import tempfile
    from pathlib import Path

    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    extra = MOE if model_type == "qwen3_moe" else {"head_dim": 8}
    config = AutoConfig.for_model(**{**TINY, **extra, "model_type": model_type})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        saved = json.loads((Path(folder) / "config.json").read_text())
        on_disk = load_file(str(Path(folder) / "model.safetensors"))
    return model.state_dict(), saved, on_disk


def test_qwen3_qk_norms_convert_and_switch_on_megatrons_qk_layernorm():
    hf, config, on_disk = tiny_qwen3("qwen3")
    megatron = hf_to_megatron(hf, config)
    layer = "decoder.layers.1.self_attention."
    assert torch.equal(megatron[layer + "q_layernorm.weight"], hf["model.layers.1.self_attn.q_norm.weight"])
    assert torch.equal(megatron[layer + "k_layernorm.weight"], hf["model.layers.1.self_attn.k_norm.weight"])
    transformer, _ = megatron_config(config)
    assert transformer["qk_layernorm"] and transformer["kv_channels"] == 8
    assert not megatron_config(tiny_model("llama", False)[1])[0]["qk_layernorm"]
    back = megatron_to_hf(megatron, config)
    assert back.keys() == hf.keys() == on_disk.keys()
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


def test_qwen3_moe_experts_from_either_form_convert_to_the_checkpoint_form():
    """transformers 5's fused experts and the per-expert checkpoint give the same megatron weights; back,
    the checkpoint's names (what SGLang and from_pretrained load)."""
    fused, config, on_disk = tiny_qwen3("qwen3_moe")
    assert "model.layers.0.mlp.experts.gate_up_proj" in fused
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in on_disk
    from_fused, from_disk = hf_to_megatron(fused, config), hf_to_megatron(on_disk, config)
    assert from_fused.keys() == from_disk.keys()
    for name, tensor in from_disk.items():
        assert torch.equal(from_fused[name], tensor), name
    expert = "decoder.layers.0.mlp.experts.local_experts.2."
    assert torch.equal(
        from_disk[expert + "linear_fc1.weight"],
        torch.cat(
            [
                on_disk["model.layers.0.mlp.experts.2.gate_proj.weight"],
                on_disk["model.layers.0.mlp.experts.2.up_proj.weight"],
            ]
        ),
    )
    assert torch.equal(
        from_disk["decoder.layers.0.mlp.router.weight"], on_disk["model.layers.0.mlp.gate.weight"]
    )
    back = megatron_to_hf(from_fused, config)
    assert back.keys() == on_disk.keys()
    for name, tensor in on_disk.items():
        assert torch.equal(back[name], tensor), name


def test_qwen3_moe_config_maps_the_router_and_experts():
    _, config, _ = tiny_qwen3("qwen3_moe")
    transformer, _ = megatron_config(config)
    assert transformer["num_moe_experts"] == 4 and transformer["moe_ffn_hidden_size"] == 16
    assert transformer["moe_router_topk"] == 2 and transformer["qk_layernorm"]
    # Hugging Face's softmax over all experts without renormalising is megatron's pre-softmax router.
    assert transformer["moe_router_pre_softmax"] is True
    assert megatron_config({**config, "norm_topk_prob": True})[0]["moe_router_pre_softmax"] is False
    published = {k: v for k, v in config.items() if k != "num_local_experts"} | {"num_experts": 128}
    assert megatron_config(published)[0]["num_moe_experts"] == 128
    with pytest.raises(ValueError, match="every layer is a MoE layer"):
        megatron_config({**config, "mlp_only_layers": [0]})


@pytest.mark.parametrize("ep", [1, 2, 4])
def test_expert_parallel_split_then_merge_is_the_identity(ep):
    fused, config, _ = tiny_qwen3("qwen3_moe")
    whole = hf_to_megatron(fused, config)
    shards = split_expert_parallel(whole, ep)
    local = "decoder.layers.1.mlp.experts.local_experts."
    assert {k for k in shards[-1] if k.startswith(local)} == {
        f"{local}{e}.linear_fc{n}.weight" for e in range(4 // ep) for n in (1, 2)
    }
    assert torch.equal(
        shards[-1][f"{local}{4 // ep - 1}.linear_fc2.weight"], whole[f"{local}3.linear_fc2.weight"]
    )
    assert shards[-1]["decoder.layers.1.mlp.router.weight"] is whole["decoder.layers.1.mlp.router.weight"]
    merged = merge_expert_parallel(shards)
    assert merged.keys() == whole.keys()
    for name, tensor in whole.items():
        assert torch.equal(merged[name], tensor), name


def test_expert_parallel_sizes_are_checked():
    _, config, _ = tiny_qwen3("qwen3_moe")
    check_expert_parallel(config, 2)
    with pytest.raises(ValueError, match="size 3 does not divide the 4 experts"):
        check_expert_parallel(config, 3)
    with pytest.raises(ValueError, match="needs a MoE model"):
        check_expert_parallel(tiny_model("llama", False)[1], 2)


@pytest.mark.parametrize("pp", [1, 2])
@pytest.mark.parametrize("tied", [True, False])
def test_pipeline_split_then_merge_is_the_identity(tied, pp):
    """Stage s holds its layers renumbered from 0, the first the embedding, the last the final norm and
    the output layer (a tied model's: a copy of the embedding, dropped again by the merge)."""
    hf, config = tiny_model("llama", tied)
    whole = hf_to_megatron(hf, config)
    stages = split_pipeline_parallel(whole, pp, tied)
    last = stages[-1]
    assert {k.split(".")[2] for k in last if k.startswith("decoder.layers.")} == {
        str(i) for i in range(2 // pp)
    }
    assert torch.equal(
        last["decoder.layers.0.input_layernorm.weight"],
        whole[f"decoder.layers.{2 - 2 // pp}.input_layernorm.weight"],
    )
    assert "decoder.final_layernorm.weight" in last
    assert ("output_layer.weight" in last) == (not tied or pp > 1)
    if pp > 1:
        assert "embedding.word_embeddings.weight" not in last
        assert "output_layer.weight" not in stages[0] and "decoder.final_layernorm.weight" not in stages[0]
        if tied:
            assert last["output_layer.weight"] is whole["embedding.word_embeddings.weight"]
    merged = merge_pipeline_parallel(stages, tied)
    assert merged.keys() == whole.keys()
    for name, tensor in whole.items():
        assert torch.equal(merged[name], tensor), name


@pytest.mark.parametrize("tied", [True, False])
def test_a_pipeline_stage_reads_only_its_part_and_splits_it_as_from_the_whole(tied):
    """Each of 2 stages keeps its layer, the first the embedding, the last the final norm and the output
    layer (a tied model's: the embedding); converted and split, that part gives the stage what the whole
    model gives it."""
    hf, config = tiny_model("llama", tied)
    from_whole = split_pipeline_parallel(hf_to_megatron(hf, config), 2, tied)
    for stage in range(2):
        keep = in_pipeline_stage(config, stage, 2)
        part = {name: tensor for name, tensor in hf.items() if keep(name)}
        layers = {name.split(".")[2] for name in part if name.startswith("model.layers.")}
        assert layers == {str(stage)}
        assert ("model.embed_tokens.weight" in part) == (stage == 0 or tied)
        assert ("model.norm.weight" in part) == (stage == 1)
        split = split_pipeline_parallel(hf_to_megatron(part, config), 2, tied, layers=2)[stage]
        assert split.keys() == from_whole[stage].keys()
        assert all(torch.equal(split[name], tensor) for name, tensor in from_whole[stage].items())


def test_pipeline_sizes_that_do_not_split_the_layers_are_refused():
    _, config = tiny_model("llama", False)
    check_pipeline_parallel(config, 2)
    with pytest.raises(ValueError, match="pipeline-parallel size 3 does not divide the 2 layers"):
        check_pipeline_parallel(config, 3)
    with pytest.raises(ValueError, match="2 layers cannot be split over 4 pipeline stages"):
        split_pipeline_parallel(hf_to_megatron(*tiny_model("llama", False)), 4, False)
