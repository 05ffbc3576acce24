"""Hugging Face Llama/Qwen2/Qwen3/Qwen3-MoE <-> megatron-core ``GPTModel`` (local layer spec):
configuration and weights.

Pure torch, no megatron import, so it runs (and is tested) on CPU. Megatron's layout differs from
Hugging Face's in two fused matrices:

- ``self_attention.linear_qkv``: q, k and v stacked per query group: for each of the ``num_key_value_heads``
  groups its ``heads / groups`` query heads, then its key head, then its value head (rows of ``head_dim``).
- ``mlp.linear_fc1`` (and each expert's ``linear_fc1``): the gate projection above the up projection
  (SwiGLU's two halves).

Qwen3's per-head RMSNorms of queries and keys (``q_norm``, ``k_norm``) are megatron's ``q_layernorm`` and
``k_layernorm``. Qwen3-MoE's router (``mlp.gate``) is ``mlp.router``; its experts are
``mlp.experts.local_experts.<e>`` (megatron's ``SequentialMLP``). Hugging Face checkpoints hold one
matrix per expert (``mlp.experts.<e>.gate_proj``...), transformers 5 models the experts' fused tensors
(``mlp.experts.gate_up_proj [experts, 2 x inter, hidden]``, ``down_proj``): both are read; the checkpoint
form is written, as SGLang and ``from_pretrained`` load it.

:func:`hf_to_megatron` and :func:`megatron_to_hf` take whole (tensor-parallel size 1) state dicts;
:func:`split_tensor_parallel` and :func:`merge_tensor_parallel` cut one into the shards of megatron-core's
tensor-parallel layers and join them back; :func:`split_expert_parallel` and :func:`merge_expert_parallel`
do the same for the experts over expert-parallel ranks, :func:`split_pipeline_parallel` and
:func:`merge_pipeline_parallel` for the layers over pipeline stages.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral", "qwen3", "qwen3_moe")
QK_NORM_MODEL_TYPES = ("qwen3", "qwen3_moe")


@dataclass(frozen=True)
class ModelShape:
    """What the conversion needs of a Hugging Face config."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_groups: int
    head_dim: int
    tied: bool
    qkv_bias: bool
    num_experts: int = 0
    """Experts per MoE layer (0: a dense model)."""

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> ModelShape:
        heads = config["num_attention_heads"]
        return cls(
            num_experts=num_experts(config),
            num_layers=config["num_hidden_layers"],
            hidden_size=config["hidden_size"],
            num_heads=heads,
            num_groups=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            tied=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=has_qkv_bias(config),
        )


def num_experts(config: dict[str, Any]) -> int:
    """Experts per layer of a MoE config (published configs say ``num_experts``, transformers 5 writes
    ``num_local_experts``); 0 for a dense model."""
    if config.get("model_type") != "qwen3_moe":
        return 0
    return int(config.get("num_experts") or config.get("num_local_experts") or 0)


def has_qkv_bias(config: dict[str, Any]) -> bool:
    return config.get("model_type") == "qwen2" or bool(config.get("attention_bias", False))


def megatron_config(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(TransformerConfig kwargs, GPTModel kwargs)`` for a Hugging Face config (a dict of config.json);
    the trainer adds dtype and parallel sizes. Fusions that need Apex or Transformer Engine are off."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"rlsdk-megatron converts {', '.join(SUPPORTED_MODEL_TYPES)} models, not {model_type!r}"
        )
    if config.get("rope_scaling"):
        raise ValueError(f"rlsdk-megatron: rope_scaling {config['rope_scaling']} is not supported yet")
    # transformers 5 writes the rope settings as rope_parameters {"rope_theta", "rope_type"}; 4 at the top
    rope = config.get("rope_parameters") or {"rope_theta": config.get("rope_theta", 10000)}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rlsdk-megatron: rope_parameters {rope} are not supported yet (default rope only)")
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"rlsdk-megatron: hidden_act {config['hidden_act']!r} (SwiGLU with silu expected)")
    shape = ModelShape.from_hf(config)
    transformer: dict[str, Any] = {
        "num_layers": shape.num_layers,
        "hidden_size": shape.hidden_size,
        "num_attention_heads": shape.num_heads,
        "num_query_groups": shape.num_groups,
        "kv_channels": shape.head_dim,
        "ffn_hidden_size": config["intermediate_size"],
        "normalization": "RMSNorm",
        "layernorm_epsilon": config.get("rms_norm_eps", 1e-6),
        "gated_linear_unit": True,
        "activation_func": torch.nn.functional.silu,
        "add_bias_linear": False,
        "add_qkv_bias": shape.qkv_bias,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "attention_softmax_in_fp32": True,
        "bias_activation_fusion": False,
        "masked_softmax_fusion": False,
        "persist_layer_norm": False,
        "bias_dropout_fusion": False,
        "apply_rope_fusion": False,
        "gradient_accumulation_fusion": False,
        "qk_layernorm": model_type in QK_NORM_MODEL_TYPES,
    }
    if shape.num_experts:
        transformer.update(moe_config(config, shape.num_experts))
    gpt = {
        "vocab_size": config["vocab_size"],
        "max_sequence_length": config.get("max_position_embeddings", 4096),
        "position_embedding_type": "rope",
        "rotary_base": int(rope.get("rope_theta", 10000)),
        "rotary_percent": 1.0,
        "share_embeddings_and_output_weights": shape.tied,
        "parallel_output": False,
    }
    return transformer, gpt


def moe_config(config: dict[str, Any], experts: int) -> dict[str, Any]:
    """``TransformerConfig`` kwargs of a Qwen3-MoE config: every layer a MoE layer, the router's softmax
    over the chosen experts' logits when ``norm_topk_prob`` (Hugging Face's top-k of the softmax divided by
    its sum is the same function), over all experts otherwise; no load-balancing loss (the RL losses are
    the objective); experts whole on each rank (``expert_tensor_parallel_size`` 1), tokens sent to their
    experts' ranks all-to-all."""
    if config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1:
        raise ValueError(
            "rlsdk-megatron converts Qwen3-MoE models whose every layer is a MoE layer "
            f"(mlp_only_layers {config.get('mlp_only_layers')}, "
            f"decoder_sparse_step {config.get('decoder_sparse_step')})"
        )
    return {
        "num_moe_experts": experts,
        "moe_ffn_hidden_size": config["moe_intermediate_size"],
        "moe_router_topk": config["num_experts_per_tok"],
        "moe_router_pre_softmax": not config.get("norm_topk_prob", False),
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_token_dispatcher_type": "alltoall",
        "moe_grouped_gemm": False,
        "expert_tensor_parallel_size": 1,
    }


_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.(.+)$")
_HF_TO_MEGATRON_LAYER = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
    "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
    "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
    "mlp.gate.weight": "mlp.router.weight",
}
_HF_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_EXPERT = "mlp.experts.local_experts"
_HF_TO_MEGATRON_TOP = {
    "model.embed_tokens.weight": "embedding.word_embeddings.weight",
    "model.norm.weight": "decoder.final_layernorm.weight",
    "lm_head.weight": "output_layer.weight",
}


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    """Hugging Face q, k, v (weights ``[out, hidden]`` or biases ``[out]``) -> megatron's grouped qkv."""
    per_group = shape.num_heads // shape.num_groups
    rest = q.shape[1:]
    q = q.reshape(shape.num_groups, per_group * shape.head_dim, *rest)
    k = k.reshape(shape.num_groups, shape.head_dim, *rest)
    v = v.reshape(shape.num_groups, shape.head_dim, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def split_qkv(qkv: torch.Tensor, shape: ModelShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    per_group = shape.num_heads // shape.num_groups
    rest = qkv.shape[1:]
    grouped = qkv.reshape(shape.num_groups, (per_group + 2) * shape.head_dim, *rest)
    q, k, v = grouped.split([per_group * shape.head_dim, shape.head_dim, shape.head_dim], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def hf_to_megatron(state: dict[str, torch.Tensor], config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A Hugging Face state dict -> a (tensor-parallel size 1) ``GPTModel`` state dict."""
    shape = ModelShape.from_hf(config)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name in _HF_TO_MEGATRON_TOP:
            if not (name == "lm_head.weight" and shape.tied):
                out[_HF_TO_MEGATRON_TOP[name]] = tensor
            continue
        match = _LAYER.match(name)
        if match is None:
            raise KeyError(f"rlsdk-megatron: no megatron name for Hugging Face weight {name!r}")
        layer, rest = match.groups()
        if rest in _HF_TO_MEGATRON_LAYER:
            out[f"decoder.layers.{layer}.{_HF_TO_MEGATRON_LAYER[rest]}"] = tensor
        elif rest.startswith(("self_attn.k_proj.", "self_attn.v_proj.", "mlp.up_proj.")):
            continue  # fused with q_proj / gate_proj below
        elif rest.startswith("self_attn.q_proj."):
            kind = rest.rsplit(".", 1)[1]
            prefix = f"model.layers.{layer}.self_attn"
            out[f"decoder.layers.{layer}.self_attention.linear_qkv.{kind}"] = fuse_qkv(
                tensor,
                _layer_weight(state, prefix, "k_proj", kind),
                _layer_weight(state, prefix, "v_proj", kind),
                shape,
            )
        elif rest == "mlp.gate_proj.weight":
            out[f"decoder.layers.{layer}.mlp.linear_fc1.weight"] = torch.cat(
                [tensor, _layer_weight(state, f"model.layers.{layer}.mlp", "up_proj", "weight")]
            )
        elif (expert := _HF_EXPERT.match(rest)) is not None:
            index, part = expert.groups()
            target = f"decoder.layers.{layer}.{_EXPERT}.{index}"
            if part == "gate_proj":
                up = _layer_weight(state, f"model.layers.{layer}.mlp.experts.{index}", "up_proj", "weight")
                out[f"{target}.linear_fc1.weight"] = torch.cat([tensor, up])
            elif part == "down_proj":
                out[f"{target}.linear_fc2.weight"] = tensor
        elif rest in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):  # transformers 5's fused form
            fc = "linear_fc1" if rest.endswith("gate_up_proj") else "linear_fc2"
            for index, matrix in enumerate(tensor.unbind(0)):
                out[f"decoder.layers.{layer}.{_EXPERT}.{index}.{fc}.weight"] = matrix
        else:
            raise KeyError(f"rlsdk-megatron: no megatron name for Hugging Face weight {name!r}")
    return out


def _layer_weight(state: dict[str, torch.Tensor], prefix: str, module: str, kind: str) -> torch.Tensor:
    name = f"{prefix}.{module}.{kind}"
    if name not in state:
        raise KeyError(f"rlsdk-megatron: the Hugging Face checkpoint lacks {name!r}")
    return state[name]


_MEGATRON_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_MEGATRON_TO_HF_LAYER = {v: k for k, v in _HF_TO_MEGATRON_LAYER.items()}
_MEGATRON_TO_HF_TOP = {v: k for k, v in _HF_TO_MEGATRON_TOP.items()}
_MEGATRON_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")


def megatron_to_hf(state: dict[str, torch.Tensor], config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A (merged) ``GPTModel`` state dict -> Hugging Face names and layout; ``_extra_state`` entries are
    skipped, and a tied model's ``lm_head.weight`` is the embedding (as Hugging Face's state dict has it)."""
    shape = ModelShape.from_hf(config)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith("_extra_state"):
            continue
        if name in _MEGATRON_TO_HF_TOP:
            out[_MEGATRON_TO_HF_TOP[name]] = tensor
            continue
        match = _MEGATRON_LAYER.match(name)
        if match is None:
            raise KeyError(f"rlsdk-megatron: no Hugging Face name for megatron weight {name!r}")
        layer, rest = match.groups()
        prefix = f"model.layers.{layer}"
        if rest in _MEGATRON_TO_HF_LAYER:
            out[f"{prefix}.{_MEGATRON_TO_HF_LAYER[rest]}"] = tensor
        elif rest.startswith("self_attention.linear_qkv."):
            kind = rest.rsplit(".", 1)[1]
            q, k, v = split_qkv(tensor, shape)
            out.update(
                {
                    f"{prefix}.self_attn.q_proj.{kind}": q,
                    f"{prefix}.self_attn.k_proj.{kind}": k,
                    f"{prefix}.self_attn.v_proj.{kind}": v,
                }
            )
        elif rest == "mlp.linear_fc1.weight":
            gate, up = tensor.chunk(2, dim=0)
            out.update({f"{prefix}.mlp.gate_proj.weight": gate, f"{prefix}.mlp.up_proj.weight": up})
        elif (expert := _MEGATRON_EXPERT.match(rest)) is not None:
            index, fc = expert.groups()
            target = f"{prefix}.mlp.experts.{index}"
            if fc == "linear_fc1":
                gate, up = tensor.chunk(2, dim=0)
                out.update({f"{target}.gate_proj.weight": gate, f"{target}.up_proj.weight": up})
            else:
                out[f"{target}.down_proj.weight"] = tensor
        else:
            raise KeyError(f"rlsdk-megatron: no Hugging Face name for megatron weight {name!r}")
    if shape.tied and "model.embed_tokens.weight" in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


# ---------------------------------------------------------------------------- tensor parallelism
#
# How megatron-core's layers shard a whole state dict over ``tp`` ranks (rank r holds part r):
# - ColumnParallelLinear splits output rows: ``linear_qkv`` (its grouped layout puts ``groups / tp`` whole
#   query groups on each rank), ``output_layer`` (vocabulary rows); ``linear_fc1`` splits gate and up
#   separately and stacks each rank's parts, ``[gate_r; up_r]`` (the layer's GLU chunks its output in two).
# - RowParallelLinear splits input columns: ``linear_proj``, ``linear_fc2``.
# - VocabParallelEmbedding splits vocabulary rows: ``embedding.word_embeddings``.
# - Norms are replicated. (Biases of row-parallel layers would be too; these models have none.)

_VOCAB_ROWS = ("embedding.word_embeddings.weight", "output_layer.weight")
_GATED = "mlp.linear_fc1.weight"
_SPLIT_ROWS = ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias", _GATED, *_VOCAB_ROWS)
_SPLIT_COLUMNS = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")


_PER_HEAD_NORMS = ("self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight")


def is_per_head_norm(name: str) -> bool:
    """Qwen3's query and key norms: replicated weights applied to each rank's own heads under tensor
    parallelism, so each rank's gradient is its heads' part (the ranks' gradients are summed)."""
    return name.endswith(_PER_HEAD_NORMS)


def tensor_parallel_dim(name: str) -> int | None:
    """The dimension megatron-core splits weight ``name`` along under tensor parallelism (None: replicated)."""
    if name.endswith(_SPLIT_ROWS):
        return 0
    if name.endswith(_SPLIT_COLUMNS):
        return 1
    return None


def check_tensor_parallel(config: dict[str, Any], tp: int) -> None:
    """Refuse a tensor-parallel size megatron-core cannot split this model by (whole heads, query groups
    and MLP columns per rank); the vocabulary is padded instead (:func:`padded_vocab_size`)."""
    shape = ModelShape.from_hf(config)
    for what, size in (
        ("attention heads", shape.num_heads),
        ("query groups (key/value heads)", shape.num_groups),
        ("MLP columns (intermediate_size)", config["intermediate_size"]),
    ):
        if size % tp:
            raise ValueError(f"rlsdk-megatron: tensor-parallel size {tp} does not divide the {size} {what}")


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    """The vocabulary rounded up to a multiple of ``tp``, as ``VocabParallelEmbedding`` needs; the extra
    rows are zeros, and the trainer drops their logits (so the loss and the gradient see the true vocabulary)."""
    return -(-vocab_size // tp) * tp


def pad_vocab(state: dict[str, torch.Tensor], size: int) -> dict[str, torch.Tensor]:
    """``state`` with the embedding and output layer given zero rows up to ``size`` (or cut to it)."""
    out = dict(state)
    for name in _VOCAB_ROWS:
        if name in out:
            tensor = out[name][:size]
            missing = size - tensor.shape[0]
            out[name] = (
                torch.cat([tensor, tensor.new_zeros(missing, *tensor.shape[1:])]) if missing else tensor
            )
    return out


def split_tensor_parallel(state: dict[str, torch.Tensor], tp: int) -> list[dict[str, torch.Tensor]]:
    """A whole ``GPTModel`` state dict (vocabulary already padded) -> one state dict per tensor-parallel rank."""
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(tp)]
    for name, tensor in state.items():
        if name.endswith("_extra_state"):
            continue
        dim = tensor_parallel_dim(name)
        if dim is None:
            parts = [tensor] * tp
        elif name.endswith(_GATED):
            gate, up = tensor.chunk(2, dim=0)
            parts = [torch.cat(pair) for pair in zip(gate.chunk(tp), up.chunk(tp), strict=True)]
        else:
            parts = list(tensor.chunk(tp, dim=dim))
        for shard, part in zip(shards, parts, strict=True):
            shard[name] = part
    return shards


def merge_tensor_parallel(shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`split_tensor_parallel`: each rank's state dict -> the whole one (replicated
    weights taken from rank 0)."""
    whole: dict[str, torch.Tensor] = {}
    for name, first in shards[0].items():
        if name.endswith("_extra_state"):
            continue
        parts = [shard[name] for shard in shards]
        dim = tensor_parallel_dim(name)
        if dim is None:
            whole[name] = first
        elif name.endswith(_GATED):
            halves = [part.chunk(2, dim=0) for part in parts]
            whole[name] = torch.cat([gate for gate, _ in halves] + [up for _, up in halves])
        else:
            whole[name] = torch.cat(parts, dim=dim)
    return whole


# ---------------------------------------------------------------------------- expert parallelism
#
# Expert-parallel rank r holds experts [r * E / ep, (r + 1) * E / ep) as its local experts 0 .. E / ep - 1;
# every other weight is the same on all of them.

_LOCAL_EXPERT = re.compile(r"^(.*\.mlp\.experts\.local_experts\.)(\d+)(\..+)$")


def is_expert_weight(name: str) -> bool:
    return _LOCAL_EXPERT.match(name) is not None


def check_expert_parallel(config: dict[str, Any], ep: int) -> None:
    """Refuse an expert-parallel size that does not divide the experts, or one given to a dense model."""
    experts = ModelShape.from_hf(config).num_experts
    if ep > 1 and not experts:
        raise ValueError(f"rlsdk-megatron: expert-parallel size {ep} needs a MoE model (qwen3_moe)")
    if experts and experts % ep:
        raise ValueError(f"rlsdk-megatron: expert-parallel size {ep} does not divide the {experts} experts")


def split_expert_parallel(state: dict[str, torch.Tensor], ep: int) -> list[dict[str, torch.Tensor]]:
    """A whole ``GPTModel`` state dict -> one per expert-parallel rank (its experts renumbered from 0)."""
    experts = 1 + max((int(m.group(2)) for m in map(_LOCAL_EXPERT.match, state) if m), default=-1)
    per_rank = experts // ep if experts else 0
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(ep)]
    for name, tensor in state.items():
        match = _LOCAL_EXPERT.match(name)
        if match is None:
            for shard in shards:
                shard[name] = tensor
            continue
        head, index, tail = match.groups()
        rank, local = divmod(int(index), per_rank)
        shards[rank][f"{head}{local}{tail}"] = tensor
    return shards


def global_expert_name(name: str, rank: int, per_rank: int) -> str:
    """Rank ``rank``'s local expert weight ``name`` under the expert's index in the whole model."""
    match = _LOCAL_EXPERT.match(name)
    if match is None:
        return name
    head, index, tail = match.groups()
    return f"{head}{rank * per_rank + int(index)}{tail}"


def merge_expert_parallel(shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`split_expert_parallel` (shared weights taken from rank 0)."""
    per_rank = 1 + max((int(m.group(2)) for m in map(_LOCAL_EXPERT.match, shards[0]) if m), default=-1)
    whole: dict[str, torch.Tensor] = {}
    for rank, shard in enumerate(shards):
        for name, tensor in shard.items():
            if is_expert_weight(name) or rank == 0:
                whole[global_expert_name(name, rank, per_rank)] = tensor
    return whole


# ---------------------------------------------------------------------------- pipeline parallelism
#
# Pipeline stage s of pp holds layers [s * L / pp, (s + 1) * L / pp) as its decoder.layers 0 .. L / pp - 1,
# the embedding on the first stage, the final norm and the output layer on the last. A tied model's last
# stage (pp > 1) holds a copy of the embedding as its output layer: megatron keeps the two equal by summing
# their gradients, and the copy is dropped when the stages are merged.

_EMBEDDING = "embedding.word_embeddings.weight"
_OUTPUT = "output_layer.weight"


def check_pipeline_parallel(config: dict[str, Any], pp: int) -> None:
    """Refuse a pipeline-parallel size that does not split the layers evenly over the stages."""
    layers = config["num_hidden_layers"]
    if layers % pp:
        raise ValueError(
            f"rlsdk-megatron: pipeline-parallel size {pp} does not divide the {layers} layers "
            "(every stage holds the same number of layers)"
        )


def split_pipeline_parallel(
    state: dict[str, torch.Tensor], pp: int, tied: bool, layers: int | None = None
) -> list[dict[str, torch.Tensor]]:
    """A ``GPTModel`` state dict -> one per pipeline stage (its layers renumbered from 0). ``layers``: the
    model's number of layers, where ``state`` holds only some stages' weights (default: ``state`` is whole)."""
    if layers is None:
        layers = 1 + max((int(m.group(1)) for m in map(_MEGATRON_LAYER.match, state) if m), default=-1)
    if layers % pp:
        raise ValueError(f"rlsdk-megatron: {layers} layers cannot be split over {pp} pipeline stages")
    per_stage = layers // pp
    stages: list[dict[str, torch.Tensor]] = [{} for _ in range(pp)]
    for name, tensor in state.items():
        if name.endswith("_extra_state"):
            continue
        match = _MEGATRON_LAYER.match(name)
        if match is not None:
            stage, local = divmod(int(match.group(1)), per_stage)
            stages[stage][f"decoder.layers.{local}.{match.group(2)}"] = tensor
        elif name.startswith("embedding."):
            stages[0][name] = tensor
            if tied and pp > 1 and name == _EMBEDDING:
                stages[-1][_OUTPUT] = tensor
        else:
            stages[-1][name] = tensor
    return stages


def in_pipeline_stage(config: dict[str, Any], stage: int, pp: int) -> Callable[[str], bool]:
    """Whether a Hugging Face weight's name is one pipeline stage ``stage`` loads: its layers, the embedding
    on the first (and on the last of a tied model, as its output layer), the final norm and ``lm_head`` on
    the last; so that a stage reads only its part of a checkpoint."""
    per_stage = config["num_hidden_layers"] // pp
    first, last = stage == 0, stage == pp - 1
    tied = bool(config.get("tie_word_embeddings"))

    def keep(name: str) -> bool:
        match = _LAYER.match(name)
        if match is not None:
            return int(match.group(1)) // per_stage == stage
        if name == "model.embed_tokens.weight":
            return first or (tied and last)
        return last

    return keep


def pipeline_stage_to_whole(
    state: dict[str, torch.Tensor], stage: int, pp: int, per_stage: int, tied: bool
) -> dict[str, torch.Tensor]:
    """Stage ``stage``'s state dict under the whole model's names (its layers numbered from
    ``stage * per_stage``; a tied model's output-layer copy dropped)."""
    whole: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if tied and pp > 1 and stage == pp - 1 and name == _OUTPUT:
            continue
        match = _MEGATRON_LAYER.match(name)
        if match is not None:
            name = f"decoder.layers.{stage * per_stage + int(match.group(1))}.{match.group(2)}"
        whole[name] = tensor
    return whole


def merge_pipeline_parallel(stages: list[dict[str, torch.Tensor]], tied: bool) -> dict[str, torch.Tensor]:
    """The inverse of :func:`split_pipeline_parallel`."""
    per_stage = 1 + max((int(m.group(1)) for m in map(_MEGATRON_LAYER.match, stages[0]) if m), default=-1)
    whole: dict[str, torch.Tensor] = {}
    for stage, state in enumerate(stages):
        whole.update(pipeline_stage_to_whole(state, stage, len(stages), per_stage, tied))
    return whole
