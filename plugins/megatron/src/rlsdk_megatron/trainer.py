"""The ``megatron`` trainer: megatron-core's ``GPTModel`` (local layer spec: no Transformer Engine or Apex;
attention through torch's SDPA) in bfloat16 on CUDA, built from a Hugging Face Llama/Qwen2 folder and synced
back in Hugging Face format.

Everything but the model is the ``torch`` trainer's: advantages, micro-batches, slime's losses on the
same logits (packed, or only the positions that predict response tokens), the optimizer step. Parallel
sizes come from slime's flags: tensor (``--tensor-model-parallel-size``) and pipeline
(``--pipeline-model-parallel-size``) parallel, data parallel the world size over both. ``rlsdk run``
trains in one process, so today both must be 1 (one GPU).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rlsdk.training.batch import TrainSample
from rlsdk.training.torch_trainer import TorchTrainer, adamw, resolve_loss

from .convert import hf_to_megatron, megatron_config, megatron_to_hf

MODEL_FILE = "model.safetensors"


def parallel_sizes(args: Any, world_size: int) -> tuple[int, int, int]:
    """``(tensor, pipeline, data)`` parallel sizes from slime's flags and the world size."""
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    if tp < 1 or pp < 1 or world_size % (tp * pp):
        raise ValueError(
            f"rlsdk-megatron: {world_size} GPU(s) cannot hold tensor-parallel size {tp} x "
            f"pipeline-parallel size {pp}"
        )
    return tp, pp, world_size // (tp * pp)


def init_distributed() -> int:
    """A one-process NCCL group unless a launcher (torchrun) set one up; returns the world size."""
    import torch.distributed as dist

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        from rlsdk.engines.launch.sglang import free_port

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        dist.init_process_group(
            "nccl", rank=int(os.environ.get("RANK", "0")), world_size=int(os.environ.get("WORLD_SIZE", "1"))
        )
    return dist.get_world_size()


def read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every ``*.safetensors`` file of a Hugging Face folder (one file or shards), on the CPU."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"rlsdk-megatron: no *.safetensors weights in {folder}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def build_gpt_model(
    hf_config: dict[str, Any],
    hf_state: dict[str, torch.Tensor],
    dtype: torch.dtype,
    device: torch.device,
    *,
    checkpointing: bool = False,
    source: str = "the Hugging Face checkpoint",
) -> Any:
    """A ``GPTModel`` (local layer spec, attention through torch's SDPA) on ``device`` holding ``hf_state``
    converted; needs megatron's model parallel state initialised. On a CPU device the weights are created
    there (as the tests do)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    from .attention import SDPAttention

    transformer, gpt = megatron_config(hf_config)
    config = TransformerConfig(
        **transformer,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        use_cpu_initialization=device.type == "cpu",
        recompute_granularity="full" if checkpointing else None,
        recompute_method="uniform" if checkpointing else None,
        recompute_num_layers=1 if checkpointing else None,
    )
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = SDPAttention
    model = GPTModel(config=config, transformer_layer_spec=spec, **gpt)
    model.to(device=device, dtype=dtype)
    missing, unexpected = model.load_state_dict(hf_to_megatron(hf_state, hf_config), strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise KeyError(
            f"rlsdk-megatron: converted weights of {source} do not fit GPTModel: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    return model


def packed_logits(model: Any, rows: list[torch.Tensor], pad_id: int, device: torch.device) -> torch.Tensor:
    """``[1, sum(len(row)), vocab]``: each token row right-padded into one causal batch (the padding comes
    after every real token, so it changes nothing), then the rows' logits concatenated."""
    logits = _padded_forward(model, rows, pad_id, device)
    return torch.cat([logits[i, : len(row)] for i, row in enumerate(rows)]).unsqueeze(0)


def response_logits(
    model: Any, rows: list[torch.Tensor], response_lengths: list[int], pad_id: int, device: torch.device
) -> torch.Tensor:
    """``[1, sum(response_lengths), vocab]``: the logits of the positions that predict each row's last
    ``response_lengths`` tokens, in order. ``GPTModel`` projects every position it is given, so a pre-hook
    hands its output layer only those positions' hidden states ``[n, 1, hidden]`` (as ``GPTModel`` itself
    keeps only the last token's for inference); its ``[s, b] -> [b, s]`` transpose then makes them one row."""
    position = torch.cat([torch.arange(len(r) - n - 1, len(r) - 1) for r, n in zip(rows, response_lengths)])
    row = torch.cat([torch.full((n,), i) for i, n in enumerate(response_lengths)])
    position, row = position.to(device), row.to(device)

    def select(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return (args[0][position, row].unsqueeze(1), *args[1:]), kwargs  # hidden states are [s, b, h]

    hook = model.output_layer.register_forward_pre_hook(select, with_kwargs=True)
    try:
        return _padded_forward(model, rows, pad_id, device)
    finally:
        hook.remove()


def _padded_forward(model: Any, rows: list[torch.Tensor], pad_id: int, device: torch.device) -> torch.Tensor:
    """``GPTModel``'s logits ``[batch, sequence, vocab]`` for the rows right-padded into one batch."""
    width = max(len(row) for row in rows)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    positions = torch.arange(width).expand(len(rows), width)
    # Without labels, GPTModel returns [batch, sequence, vocab] (it transposes its [s, b, v] output).
    return model(input_ids=tokens.to(device), position_ids=positions.to(device), attention_mask=None)


class MegatronTrainer(TorchTrainer):
    """AdamW on a megatron-core ``GPTModel``; options from ``args`` (slime's names)."""

    def __init__(self, args: Any) -> None:
        from transformers import AutoTokenizer

        if not torch.cuda.is_available():
            raise RuntimeError("rlsdk-megatron trains on CUDA GPUs only: use --trainer torch on CPU")
        self.args = args
        self.model_path = args.hf_checkpoint or args.model
        if not self.model_path:
            raise ValueError("the megatron trainer needs a Hugging Face model folder: pass --hf-checkpoint")
        world = init_distributed()
        tp, pp, dp = parallel_sizes(args, world)
        if (tp, pp, dp) != (1, 1, 1):
            raise ValueError(
                f"rlsdk-megatron: tensor {tp} x pipeline {pp} x data {dp} parallel needs one process "
                "per GPU, which rlsdk run does not start yet; use sizes 1 (one GPU)"
            )
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(tp, pp)
        model_parallel_cuda_manual_seed(args.rollout_seed)
        torch.manual_seed(args.rollout_seed)
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.dtype = (
            torch.bfloat16 if args.train_dtype in ("auto", "bfloat16") else getattr(torch, args.train_dtype)
        )
        self.hf_config = json.loads((Path(self.model_path) / "config.json").read_text())
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.model = self._build(read_hf_weights(Path(self.model_path)))
        self.model.train()
        self.optimizer = adamw(self.model, args)
        self.loss = resolve_loss(args)
        self.ref_model = None
        if args.use_kl_loss or args.kl_coef:
            reference = read_hf_weights(Path(args.ref_load or self.model_path))
            self.ref_model = self._build(reference).eval().requires_grad_(False)

    def _build(self, hf_state: dict[str, torch.Tensor]) -> Any:
        return build_gpt_model(
            self.hf_config,
            hf_state,
            self.dtype,
            self.device,
            checkpointing=self.args.gradient_checkpointing,
            source=str(self.model_path),
        )

    def _packed_logits(self, model: Any, data: list[TrainSample], indices: list[int]) -> torch.Tensor:
        """slime's packed layout ``[1, sum(total_lengths), vocab]``, as the loss code expects."""
        return packed_logits(model, self._rows(data, indices), self.tokenizer.pad_token_id or 0, self.device)

    def _response_logits(self, model: Any, data: list[TrainSample], indices: list[int]) -> torch.Tensor:
        """The logits of the positions that predict response tokens, projected at those positions only."""
        lengths = [data[i].response_length for i in indices]
        rows = self._rows(data, indices)
        return response_logits(model, rows, lengths, self.tokenizer.pad_token_id or 0, self.device)

    @staticmethod
    def _rows(data: list[TrainSample], indices: list[int]) -> list[torch.Tensor]:
        return [torch.as_tensor(data[i].tokens) for i in indices]

    # ------------------------------------------------------------------ weights and checkpoints

    def weights(self) -> Mapping[str, Any]:
        return megatron_to_hf(self.model.state_dict(), self.hf_config)

    def save_hf_model(self, folder: Path) -> None:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        # Copies: the split q, k, v (and gate, up) are views of one tensor, which safetensors refuses.
        state = {k: v.detach().to("cpu", copy=True) for k, v in self.weights().items()}
        if self.hf_config.get("tie_word_embeddings"):
            state.pop("lm_head.weight", None)
        save_file(state, str(folder / MODEL_FILE), metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(self.hf_config, indent=2))
        self.tokenizer.save_pretrained(folder)

    def load_checkpoint(self, folder: Path) -> None:
        converted = hf_to_megatron(read_hf_weights(folder), self.hf_config)
        self.model.load_state_dict(converted, strict=False)
        self._load_optimizer_and_rng(folder)
