"""megatron-core on CPU for the tests (imported by them and, by file path, by the rank processes).

megatron-core 0.19 assumes CUDA in places a float32, dropout-free forward and backward does not need,
which :func:`patch_for_cpu` points at the CPU: the rotary frequencies (and a MoE router's weights) are moved
to ``torch.cuda.current_device()``, the default causal mask is allocated on ``"cuda"``, attention dropout
forks the CUDA RNG tracker, and the MoE all-to-all dispatcher copies its split sizes to the host on a side
CUDA stream, as numpy arrays only when they were on the GPU (here: no stream, and numpy arrays always, as
``all_to_all_single`` takes them). The pipeline schedules count tokens in a tensor made on ``"cuda"`` and
synchronize CUDA after their point-to-point exchanges (here: the tensor on the CPU, nothing to wait for), and
a tied model's last stage moves its embedding copy to CUDA before the all-reduce that fills it (here: it
stays). Everything else is megatron's real code.
"""

from __future__ import annotations

import functools
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


class _NoStream:
    """Stands for the CUDA streams of MoE's token dispatcher: one and the same "stream" everywhere, its
    events already complete (the host copies it orders are done in place)."""

    def record_event(self) -> _NoStream:
        return self

    def synchronize(self) -> None:
        pass


def _host_copy(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
    if as_numpy and isinstance(tensor, torch.Tensor):
        return tensor.numpy()
    return tensor


class _TorchOnCpu:
    """``torch`` for megatron's schedules module, its ``zeros`` on the CPU whatever device it names."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def zeros(*size: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(*size, **{**kwargs, "device": "cpu"})


class _NoDropoutRng:
    def fork(self, *args: Any, **kwargs: Any) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()


def patch_for_cpu(set_attribute: Callable[[Any, str, Any], None] = setattr) -> None:
    """Apply the patches with ``set_attribute`` (``monkeypatch.setattr`` to undo them later)."""
    from megatron.core import tensor_parallel
    from megatron.core.fusions import fused_softmax
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.transformer.moe import token_dispatcher
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    set_attribute(torch.cuda, "current_device", lambda: "cpu")
    set_attribute(
        fused_softmax, "get_default_causal_mask", lambda sq: torch.ones(sq, sq, dtype=torch.bool).triu(1)
    )
    set_attribute(tensor_parallel, "get_cuda_rng_tracker", lambda *args, **kwargs: _NoDropoutRng())
    stream = _NoStream()
    set_attribute(MoEAlltoAllTokenDispatcher, "cuda_dtoh_stream", stream)
    set_attribute(torch.cuda, "current_stream", lambda *args, **kwargs: stream)
    set_attribute(torch.cuda, "stream", lambda *args, **kwargs: contextlib.nullcontext())
    set_attribute(token_dispatcher, "maybe_move_tensor_to_cpu", _host_copy)
    set_attribute(schedules, "torch", _TorchOnCpu())
    set_attribute(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    set_attribute(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)


def cpu_trainer(args: Any) -> Any:
    """A rank's ``MegatronTrainer`` on the CPU (one thread: the ranks share the machine)."""
    from rlsdk_megatron.trainer import MegatronTrainer

    patch_for_cpu()
    torch.set_num_threads(1)
    return MegatronTrainer(args, torch.device("cpu"))


def packed_sft_loss(args: Any, batch: Any, logits: Any, reduce: Any) -> Any:
    """slime's ``sft_loss`` as a loss plugin given by path, which reads packed logits (a path's default)."""
    return core_loss("sft_loss")(args, batch, logits, reduce)


@functools.cache
def core_loss(name: str) -> Any:
    """One of core's own losses, resolved by name as a run resolves it."""
    from rlsdk import get_plugin_manager

    return get_plugin_manager(load_entrypoints=False).resolve("loss", name).func


def local_gpt(
    pre_process: bool, post_process: bool, vp_stage: Any = None, config: Any = None, model_kwargs: Any = None
) -> Any:
    """A ``model_provider`` as docs/plugin-kinds.md shows one: megatron's ``GPTModel`` with the local layer
    spec (attention through the trainer's SDPA), built for the pipeline stage it is asked for."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from rlsdk_megatron.attention import SDPAttention

    spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = SDPAttention
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        pre_process=pre_process,
        post_process=post_process,
        **model_kwargs,
    )


def tiny_llama(**changes: Any) -> dict[str, Any]:
    """The config of a tiny GQA Llama (two layers, a 127-token vocabulary that tensor parallelism must pad,
    rope base 500000, large initial weights so that attention is far from uniform), with ``changes``: each
    test's model, for :func:`save_tiny`."""
    return {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 127,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "initializer_range": 0.2,
        **changes,
    }


def save_tiny(path: Path, config: dict[str, Any]) -> Path:
    """A Hugging Face folder of a model with ``config`` and random weights (seed 0), and a word-level
    tokenizer ``t0``..``t<vocab-1>``."""
    from tokenizers import Tokenizer, models
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(**config)).save_pretrained(path)
    vocab = {f"t{i}": i for i in range(config["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="t0").save_pretrained(path)
    return path
