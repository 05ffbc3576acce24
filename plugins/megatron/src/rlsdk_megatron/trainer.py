"""The ``megatron`` trainer: megatron-core's ``GPTModel`` (local layer spec: no Transformer Engine or Apex;
attention through torch's SDPA) in bfloat16 on CUDA, built from a Hugging Face Llama/Qwen2/Qwen3/Qwen3-MoE
folder and synced back in Hugging Face format.

Everything but the model is the ``torch`` trainer's: advantages, micro-batches, slime's losses on the
same full-vocabulary logits (packed, or only the positions that predict response tokens), the optimizer
step. One process per GPU: ``actor_num_gpus_per_node`` of them (default TP x PP), started and driven by
the ``rlsdk run`` process (:mod:`.rank_group`). Tensor parallel (``--tensor-model-parallel-size``):
each rank holds its shard of megatron's parallel layers (:func:`~.convert.split_tensor_parallel`) and the
output layer gathers the logits; a MoE model is split with sequence parallelism too (megatron's MoE
layers need it: each rank holds part of every row's tokens and routes them to its experts, kept whole).
Data parallel (the world size over TP x PP): each replica trains on its share of every global batch, the
loss divided by the whole batch's denominator and the gradients summed over the replicas, so the step is
the one-process step. Expert parallel (``--expert-model-parallel-size``, MoE
models): the experts are split over that many data-parallel ranks, tokens reach them all-to-all, and every
rank runs as many forward passes as its peers (an empty pass where it has fewer micro-batches), since each
MoE layer's all-to-all is collective. Pipeline parallel (``--pipeline-model-parallel-size``): each
stage holds its share of the layers (the embedding on the first, the output layer on the last), and
megatron-core's 1F1B schedule (``get_forward_backward_func``) runs a global batch's micro-batches through
the stages, activations of each micro-batch's own shape exchanged between them (``variable_seq_lengths``);
the last stage computes the loss and the log-probs, which it hands the other stages. Weights leave the
stages one tensor at a time to rank 0 (:meth:`MegatronTrainer.weights`).

With ``offload_train`` (on with ``--colocate``) :meth:`MegatronTrainer.offload` moves the optimizer state
(and any gradients) to CPU memory while the engines generate; :meth:`MegatronTrainer.onload` brings it back.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from rlsdk import Sample
from rlsdk.trainer_api import (
    OPTIMIZER_FILE,
    MegatronHooks,
    TorchTrainer,
    TrainSample,
    adamw,
    byte_buckets,
    resolve_loss,
)

from .convert import (
    ModelShape,
    check_expert_parallel,
    check_pipeline_parallel,
    check_tensor_parallel,
    global_expert_name,
    hf_to_megatron,
    in_pipeline_stage,
    is_expert_weight,
    is_per_head_norm,
    megatron_config,
    megatron_to_hf,
    merge_tensor_parallel,
    pad_vocab,
    padded_vocab_size,
    pipeline_stage_to_whole,
    split_expert_parallel,
    split_pipeline_parallel,
    split_tensor_parallel,
    tensor_parallel_dim,
)

MODEL_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PARALLEL_FILE = "megatron_parallel.json"
GRADIENT_BUCKET = 2**27
"""Gradient elements all-reduced at once over the data-parallel group."""


def parallel_sizes(args: Any, world_size: int) -> tuple[int, int, int]:
    """``(tensor, pipeline, data)`` parallel sizes from slime's flags and the world size (expert parallel
    splits the data-parallel ranks: it must divide their number)."""
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    ep = getattr(args, "expert_model_parallel_size", 1)
    if tp < 1 or pp < 1 or ep < 1 or world_size % (tp * pp) or (world_size // (tp * pp)) % ep:
        raise ValueError(
            f"rlsdk-megatron: {world_size} GPU(s) cannot hold tensor-parallel size {tp} x "
            f"pipeline-parallel size {pp} with expert-parallel size {ep} over the data-parallel ranks"
        )
    return tp, pp, world_size // (tp * pp)


def check_parallel_sizes(
    args: Any, world_size: int, hf_config: dict[str, Any] | None
) -> tuple[int, int, int]:
    """``(tensor, pipeline, data)`` sizes this trainer can train with, else a ``ValueError`` naming why
    (given the model's config): a tensor-parallel size the model cannot be split by, a pipeline-parallel
    size that does not divide its layers, an expert-parallel size that does not divide its experts."""
    tp, pp, dp = parallel_sizes(args, world_size)
    ep = getattr(args, "expert_model_parallel_size", 1)
    if hf_config is not None:
        check_tensor_parallel(hf_config, tp)
        check_expert_parallel(hf_config, ep)
        check_pipeline_parallel(hf_config, pp)
    return tp, pp, dp


def cuda_device() -> torch.device:
    """This process's GPU (``LOCAL_RANK``); refuses a machine without CUDA."""
    if not torch.cuda.is_available():
        raise RuntimeError("rlsdk-megatron trains on CUDA GPUs only: use --trainer torch on CPU")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def init_distributed(device: torch.device) -> int:
    """A one-process group (NCCL, or gloo on CPU) unless one is set up (:mod:`.rank_group`, torchrun);
    returns the world size."""
    import torch.distributed as dist

    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        from rlsdk.trainer_api import free_port

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            rank=int(os.environ.get("RANK", "0")),
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
        )
    return dist.get_world_size()


def read_hf_weights(folder: Path, keep: Callable[[str], bool] | None = None) -> dict[str, torch.Tensor]:
    """The weights of a Hugging Face folder's ``*.safetensors`` files (one file or shards) on the CPU; with
    ``keep``, only the names it keeps are read (:func:`in_pipeline_stage`: a stage's part)."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"rlsdk-megatron: no *.safetensors weights in {folder}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as weights:
            state.update({n: weights.get_tensor(n) for n in weights.keys() if keep is None or keep(n)})
    return state


def build_gpt_model(
    hf_config: dict[str, Any],
    hf_state: dict[str, torch.Tensor],
    dtype: torch.dtype,
    device: torch.device,
    *,
    checkpointing: bool = False,
    source: str = "the Hugging Face checkpoint",
    tensor_parallel: tuple[int, int] = (0, 1),
    expert_parallel: tuple[int, int] = (0, 1),
    pipeline_parallel: tuple[int, int] = (0, 1),
    provider: tuple[Callable[[Any, dict[str, Any], bool, bool], Any], str] | None = None,
) -> Any:
    """A ``GPTModel`` (local layer spec, attention through torch's SDPA) on ``device`` holding ``hf_state``
    converted, or its shard ``rank`` of ``tensor_parallel = (rank, size)`` (the vocabulary padded to a
    multiple of the size), of ``expert_parallel`` (its experts) and of ``pipeline_parallel`` (its stage's
    layers: ``hf_state`` may hold only those, :func:`in_pipeline_stage`); needs megatron's model parallel
    state initialised. On a CPU device the weights are created there (as the tests do). ``provider = (build, name)``: ``build(config, model_kwargs, pre_process,
    post_process)`` makes the model (the stage's) instead (``name``'s, a ``model_provider`` plugin)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    from .attention import SDPAttention
    from .norm import SequenceParallelRMSNorm

    tp_rank, tp = tensor_parallel
    ep_rank, ep = expert_parallel
    stage, pp = pipeline_parallel
    transformer, gpt = megatron_config(hf_config)
    gpt["vocab_size"] = padded_vocab_size(gpt["vocab_size"], tp)
    # megatron refuses variable sequence lengths with its default dispatcher, MoE layers or not
    transformer.setdefault("moe_token_dispatcher_type", "alltoall")
    config = TransformerConfig(
        **transformer,
        tensor_model_parallel_size=tp,
        expert_model_parallel_size=ep,
        pipeline_model_parallel_size=pp,
        # megatron's MoE layers need each tensor-parallel rank to hold a part of the sequence
        sequence_parallel=tp > 1 and bool(transformer.get("num_moe_experts")),
        pipeline_dtype=dtype,
        variable_seq_lengths=pp > 1,  # every micro-batch has its own shape
        calculate_per_token_loss=True,  # the schedule leaves the loss as the trainer divided it
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        use_cpu_initialization=device.type == "cpu",
        recompute_granularity="full" if checkpointing else None,
        recompute_method="uniform" if checkpointing else None,
        recompute_num_layers=1 if checkpointing else None,
    )
    spec = get_gpt_layer_local_spec(
        num_experts=transformer.get("num_moe_experts"),
        moe_grouped_gemm=False,
        qk_layernorm=transformer["qk_layernorm"],
        normalization="RMSNorm",
    )
    spec.submodules.self_attention.submodules.core_attention = SDPAttention
    spec.submodules.input_layernorm = spec.submodules.pre_mlp_layernorm = SequenceParallelRMSNorm
    if transformer["qk_layernorm"]:
        attention = spec.submodules.self_attention.submodules
        attention.q_layernorm = attention.k_layernorm = SequenceParallelRMSNorm
    block = TransformerBlockSubmodules(
        layer_specs=[spec] * (transformer["num_layers"] // pp), layer_norm=SequenceParallelRMSNorm
    )
    if provider is None:
        model = GPTModel(
            config=config,
            transformer_layer_spec=block,
            pre_process=stage == 0,
            post_process=stage == pp - 1,
            **gpt,
        )
    else:
        model = provider[0](config, gpt, stage == 0, stage == pp - 1)
    model.to(device=device, dtype=dtype)
    converted = pad_vocab(hf_to_megatron(hf_state, hf_config), gpt["vocab_size"])
    shard = shard_of(converted, hf_config, tensor_parallel, expert_parallel, pipeline_parallel)
    missing, unexpected = model.load_state_dict(shard, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise KeyError(
            f"rlsdk-megatron: converted weights of {source} do not fit "
            f"{'GPTModel' if provider is None else 'the model of ' + provider[1]}: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    return model


def shard_of(
    state: dict[str, torch.Tensor],
    hf_config: dict[str, Any],
    tensor_parallel: tuple[int, int],
    expert_parallel: tuple[int, int],
    pipeline_parallel: tuple[int, int],
) -> dict[str, torch.Tensor]:
    """A rank's part of a ``GPTModel`` state dict (the whole model's, or at least its pipeline stage's),
    given its ``(rank, size)`` in each parallelism."""
    (tp_rank, tp), (ep_rank, ep), (stage, pp) = tensor_parallel, expert_parallel, pipeline_parallel
    shard = split_expert_parallel(split_tensor_parallel(state, tp)[tp_rank], ep)[ep_rank]
    tied = bool(hf_config.get("tie_word_embeddings"))
    return split_pipeline_parallel(shard, pp, tied, hf_config["num_hidden_layers"])[stage]


def packed_logits(
    model: Any, rows: list[torch.Tensor], pad_id: int, device: torch.device, vocab_size: int | None = None
) -> torch.Tensor:
    """``[1, sum(len(row)), vocab]``: each token row right-padded into one causal batch (the padding comes
    after every real token, so it changes nothing), then the rows' logits concatenated; ``vocab_size``
    drops the logits of a padded vocabulary's extra rows."""
    logits = _padded_forward(model, rows, pad_id, device, vocab_size)
    return torch.cat([logits[i, : len(row)] for i, row in enumerate(rows)]).unsqueeze(0)


def response_logits(
    model: Any,
    rows: list[torch.Tensor],
    response_lengths: list[int],
    pad_id: int,
    device: torch.device,
    vocab_size: int | None = None,
) -> torch.Tensor:
    """``[1, sum(response_lengths), vocab]``: the logits of the positions that predict each row's last
    ``response_lengths`` tokens, in order. ``GPTModel`` projects every position it is given, so a pre-hook
    hands its output layer only those positions' hidden states ``[n, 1, hidden]`` (as ``GPTModel`` itself
    keeps only the last token's for inference); its ``[s, b] -> [b, s]`` transpose then makes them one row.
    Under sequence parallelism the hook gathers the ranks' parts of the sequence first (each rank's gradient
    then flows back to its own part) and the output layer, given the same positions on every rank, gathers
    nothing more (as ``GPTModel`` does for inference)."""
    from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

    position = torch.cat([torch.arange(len(r) - n - 1, len(r) - 1) for r, n in zip(rows, response_lengths)])
    row = torch.cat([torch.full((n,), i) for i, n in enumerate(response_lengths)])
    position, row = position.to(device), row.to(device)
    output_layer = model.output_layer
    sequence_parallel = output_layer.sequence_parallel

    def select(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        hidden = args[0]  # [s, b, h]
        if sequence_parallel:
            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return (hidden[position, row].unsqueeze(1), *args[1:]), kwargs

    hook = output_layer.register_forward_pre_hook(select, with_kwargs=True)
    output_layer.sequence_parallel = False
    try:
        return _padded_forward(model, rows, pad_id, device, vocab_size)
    finally:
        hook.remove()
        output_layer.sequence_parallel = sequence_parallel


def _padded_forward(
    model: Any, rows: list[torch.Tensor], pad_id: int, device: torch.device, vocab_size: int | None
) -> torch.Tensor:
    """``GPTModel``'s logits ``[batch, sequence, vocab]`` for the rows right-padded into one batch (the
    whole vocabulary: with tensor parallelism the output layer gathers it, ``parallel_output=False``)."""
    width = max(len(row) for row in rows)
    if model.config.sequence_parallel:  # each tensor-parallel rank takes an equal part of the sequence
        width = -(-width // model.config.tensor_model_parallel_size) * model.config.tensor_model_parallel_size
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    positions = torch.arange(width).expand(len(rows), width)
    # Without labels, GPTModel returns [batch, sequence, vocab] (it transposes its [s, b, v] output).
    logits = model(input_ids=tokens.to(device), position_ids=positions.to(device), attention_mask=None)
    return logits if vocab_size is None else logits[..., :vocab_size]


class MegatronTrainer(TorchTrainer):
    """AdamW on this rank's part of a megatron-core ``GPTModel``; options from ``args`` (slime's names).

    Every method is collective: with several processes each one calls it (:mod:`.rank_group`)."""

    def __init__(self, args: Any, device: torch.device | None = None) -> None:
        self.device = device or cuda_device()
        if args.advantage_estimator == "ppo" or args.lora_rank:
            raise ValueError(
                "rlsdk-megatron trains neither a critic (--advantage-estimator ppo) nor a LoRA adapter "
                "(--lora-rank) yet: use --trainer torch"
            )
        import torch.distributed as dist
        from megatron.core import parallel_state
        from transformers import AutoTokenizer

        self.args = args
        self.hooks = MegatronHooks(args)
        self.model_path = args.hf_checkpoint or args.model
        if not self.model_path:
            raise ValueError("the megatron trainer needs a Hugging Face model folder: pass --hf-checkpoint")
        self.hf_config = json.loads((Path(self.model_path) / "config.json").read_text())
        tp, pp, dp = check_parallel_sizes(args, init_distributed(self.device), self.hf_config)
        self.ep = args.expert_model_parallel_size
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(
                tp, pp, expert_model_parallel_size=self.ep, expert_tensor_parallel_size=1
            )
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.dp_group = parallel_state.get_data_parallel_group()
        self.ep_group = parallel_state.get_expert_model_parallel_group()
        self.ep_rank = parallel_state.get_expert_model_parallel_rank()
        self.expert_dp_group = parallel_state.get_expert_data_parallel_group()
        self.tp_rank, self.dp_rank, self.dp_size = (
            parallel_state.get_tensor_model_parallel_rank(),
            parallel_state.get_data_parallel_rank(),
            dp,
        )
        self.tp = tp
        self.pp, self.pp_rank = pp, parallel_state.get_pipeline_model_parallel_rank()
        self.pp_group = parallel_state.get_pipeline_model_parallel_group()
        self.is_last_stage = self.pp_rank == pp - 1
        self.tied = bool(self.hf_config.get("tie_word_embeddings"))
        self.is_first_rank = dist.get_rank() == 0
        if self.device.type == "cuda":
            from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

            model_parallel_cuda_manual_seed(args.rollout_seed)
        torch.manual_seed(args.rollout_seed)
        self.hooks.init()  # megatron_init
        self.dtype = (
            torch.bfloat16 if args.train_dtype in ("auto", "bfloat16") else getattr(torch, args.train_dtype)
        )
        self.vocab_size = self.hf_config["vocab_size"]
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.stage_weights = in_pipeline_stage(self.hf_config, self.pp_rank, pp)
        """Which Hugging Face weights this rank's pipeline stage reads from a checkpoint."""
        self.model = self._build(read_hf_weights(Path(self.model_path), self.stage_weights))
        self.model.train()
        self.optimizer = adamw(self.model, args)
        self.loss = resolve_loss(args)
        self.ref_model = None
        if args.use_kl_loss or args.kl_coef:
            reference = read_hf_weights(Path(args.ref_load or self.model_path), self.stage_weights)
            self.ref_model = self._build(reference).eval().requires_grad_(False)

    def _build(self, hf_state: dict[str, torch.Tensor]) -> Any:
        provider = self.hooks.model_provider
        return build_gpt_model(
            self.hf_config,
            hf_state,
            self.dtype,
            self.device,
            checkpointing=self.args.gradient_checkpointing,
            source=str(self.model_path),
            tensor_parallel=(self.tp_rank, self.tp),
            expert_parallel=(self.ep_rank, self.ep),
            pipeline_parallel=(self.pp_rank, self.pp),
            provider=None if provider is None else (self._provided_model, provider.describe()),
        )

    def _provided_model(
        self, config: Any, model_kwargs: dict[str, Any], pre_process: bool, post_process: bool
    ) -> Any:
        """The ``model_provider`` plugin's model of this rank's pipeline stage."""
        return self.hooks.provide_model(
            pre_process=pre_process,
            post_process=post_process,
            vp_stage=None,
            config=config,
            model_kwargs=model_kwargs,
        )

    def _before_train_step(self, rollout_id: int, step_id: int) -> None:
        # megatron_before_train_step
        self.hooks.before_train_step(rollout_id, step_id, [self.model], self.optimizer)

    def _packed_logits(self, model: Any, data: list[TrainSample], indices: list[int]) -> torch.Tensor:
        """slime's packed layout ``[1, sum(total_lengths), vocab]``, as the loss code expects."""
        rows = self._rows(data, indices)
        return packed_logits(model, rows, self.tokenizer.pad_token_id or 0, self.device, self.vocab_size)

    def _response_logits(self, model: Any, data: list[TrainSample], indices: list[int]) -> torch.Tensor:
        """The logits of the positions that predict response tokens, projected at those positions only."""
        lengths = [data[i].response_length for i in indices]
        rows = self._rows(data, indices)
        pad_id = self.tokenizer.pad_token_id or 0
        return response_logits(model, rows, lengths, pad_id, self.device, self.vocab_size)

    @staticmethod
    def _rows(data: list[TrainSample], indices: list[int]) -> list[torch.Tensor]:
        return [torch.as_tensor(data[i].tokens) for i in indices]

    # ------------------------------------------------------------------ data and expert parallelism

    def _micro_batches(self, samples: list[TrainSample]) -> list[list[int]]:
        """With expert parallelism every rank runs as many passes as the rank with the most micro-batches
        (each MoE layer's all-to-all is collective): the others end with empty ones."""
        planned = super()._micro_batches(samples)
        if self.ep == 1:
            return planned
        import torch.distributed as dist

        counts: list[Any] = [None] * dist.get_world_size(self.ep_group)
        dist.all_gather_object(counts, len(planned), group=self.ep_group)
        return planned + [[] for _ in range(max(counts) - len(planned))]

    def _empty_pass(self, backward: bool) -> None:
        """A forward (and backward) pass of one padding token contributing nothing: this rank's part in
        its expert-parallel peers' all-to-all exchanges."""
        pad = torch.tensor([self.tokenizer.pad_token_id or 0])
        with torch.set_grad_enabled(backward):
            logits = packed_logits(self.model, [pad], int(pad), self.device, self.vocab_size)
            if backward:
                (logits.sum() * 0.0).backward()

    def _data_parallel_share(self, indices: list[int]) -> list[int]:
        """This replica's contiguous part of a global batch (replicas in rank order)."""
        size = -(-len(indices) // self.dp_size)
        return indices[self.dp_rank * size : (self.dp_rank + 1) * size]

    def _sum_over_data_parallel(self, totals: dict[str, float], tokens: int) -> tuple[dict[str, float], int]:
        if self.dp_size == 1:
            return totals, tokens
        parts = self._gather_objects((totals, tokens))
        summed: dict[str, float] = {}
        for part, _ in parts:
            for key, value in part.items():
                summed[key] = summed.get(key, 0.0) + value
        return summed, sum(count for _, count in parts)

    def _gather_objects(self, value: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.dp_size
        dist.all_gather_object(out, value, group=self.dp_group)
        return out

    @torch.no_grad()
    def _log_probs(
        self, model: Any, data: list[TrainSample], temperature: float | None = None
    ) -> list[torch.Tensor]:
        """Each replica computes its share (through the pipeline's stages); all of them get every sample's
        log-probs."""
        # megatron_before_log_prob
        self.hooks.before_log_prob([model], "ref_" if model is self.ref_model else "")
        share = self._data_parallel_share(list(range(len(data))))
        part = [data[i] for i in share]
        if self.pp > 1:
            mine = self._pipeline_log_probs(model, part, temperature)
        else:
            mine = super()._log_probs(model, part, temperature)
        if self.dp_size == 1:
            return mine
        return [log_probs for part in self._gather_objects(mine) for log_probs in part]

    # ------------------------------------------------------------------ pipeline parallelism

    def _pipeline_log_probs(
        self, model: Any, data: list[TrainSample], temperature: float | None
    ) -> list[torch.Tensor]:
        """The log-probs of ``data``'s responses, micro-batch by micro-batch through the stages; the last
        stage's handed to the others."""
        micros = self._micro_batches(data)

        def step(micro: list[int], logits: torch.Tensor, non_loss_data: bool = True) -> list[torch.Tensor]:
            return self._micro_batch_log_probs(data, micro, logits, temperature) if micro else []

        outputs = self._run_pipeline(model, data, micros, step, forward_only=True, response=True)
        mine = [lp for part in outputs for lp in part] if self.is_last_stage else None
        return self._from_last_stage(mine)

    def _accumulate_gradients(
        self,
        samples: list[Sample],
        data: list[TrainSample],
        share: list[int],
        per_sample: dict[str, list[Any]],
        denominator: float,
    ) -> tuple[dict[str, float], int]:
        """With pipeline parallelism megatron's 1F1B schedule runs the passes: the last stage computes each
        micro-batch's loss and the metrics, which it hands the other stages."""
        if self.pp == 1:
            return super()._accumulate_gradients(samples, data, share, per_sample, denominator)
        micros = [[share[i] for i in micro] for micro in self._micro_batches([data[i] for i in share])]

        def step(micro: list[int], logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
            if not micro:  # an empty pass contributes nothing
                return logits.sum() * 0.0, torch.tensor(0, dtype=torch.int), ({}, 0)
            loss, metrics, tokens = self._micro_batch_loss(samples, data, micro, per_sample, logits)
            return loss / denominator, torch.tensor(tokens, dtype=torch.int), (metrics, tokens)

        outputs = self._run_pipeline(
            self.model, data, micros, step, forward_only=False, response=self.loss.record.logits == "response"
        )
        totals: dict[str, float] = {}
        tokens = 0
        for metrics, count in outputs if self.is_last_stage else []:
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + value / denominator
            tokens += count
        result: tuple[dict[str, float], int] = self._from_last_stage((totals, tokens))
        return result

    def _run_pipeline(
        self,
        model: Any,
        data: list[TrainSample],
        micros: list[list[int]],
        step: Any,
        forward_only: bool,
        response: bool,
    ) -> list[Any]:
        """megatron-core's schedule over the micro-batches ``micros`` (indices into ``data``): each stage runs
        its layers, the last one calls ``step(micro, logits)`` (the response positions' logits with
        ``response``, else the packed ones) and returns what the schedule kept of its results (nothing on the
        other stages). An empty micro-batch is a pass of one padding token (its packed logits to ``step``):
        this rank's part in its expert-parallel peers' all-to-all exchanges."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        pad_id = self.tokenizer.pad_token_id or 0
        queue = iter(micros)

        def forward_step(_iterator: Any, stage: Any) -> tuple[torch.Tensor, Any]:
            micro = next(queue)
            rows = self._rows(data, micro) if micro else [torch.tensor([pad_id])]
            if not self.is_last_stage:  # hidden states [sequence, batch, hidden] for the next stage
                return _padded_forward(stage, rows, pad_id, self.device, None), None
            if response and micro:
                lengths = [data[i].response_length for i in micro]
                logits = response_logits(stage, rows, lengths, pad_id, self.device, self.vocab_size)
            else:
                logits = packed_logits(stage, rows, pad_id, self.device, self.vocab_size)
            return logits, functools.partial(step, micro)

        if not micros:
            return []
        return list(
            get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=None,
                model=model,
                num_microbatches=len(micros),
                seq_length=1,  # ignored: the stages exchange each micro-batch's shape
                micro_batch_size=1,
                forward_only=forward_only,
                collect_non_loss_data=forward_only,
            )
        )

    def _from_last_stage(self, value: Any) -> Any:
        """``value`` as the last pipeline stage has it, on every stage."""
        import torch.distributed as dist
        from megatron.core import parallel_state

        box = [value]
        source = parallel_state.get_pipeline_model_parallel_last_rank()
        dist.broadcast_object_list(box, src=source, group=self.pp_group)
        return box[0]

    def _optimizer_step(self) -> float:
        """Gradients summed over the replicas (an expert's over the ranks holding the same experts: the
        all-to-all already brought it every replica's tokens, or each tensor-parallel rank's part of the
        sequence), Qwen3's query and key norms' and, under sequence parallelism, the norms' and routers'
        over the tensor-parallel ranks (each holds its heads' or its sequence part's), a tied model's embedding and its last stage's
        copy summed over the two stages, then clipped by the whole model's norm (a tensor-parallel shard
        counted on its rank, an expert on its expert-parallel rank, a layer on its stage, a replicated
        weight or the tied copy once), then AdamW on this rank's parameters."""
        import torch.distributed as dist

        named: list[tuple[str, Any, torch.Tensor]] = []
        for name, p in self.model.named_parameters():
            if p.requires_grad:
                if p.grad is None:  # a replica without samples in this batch still takes part in the sum
                    p.grad = torch.zeros_like(p)
                named.append((name, p, p.grad))
        dense = [grad for name, _, grad in named if not is_expert_weight(name)]
        experts = [grad for name, _, grad in named if is_expert_weight(name)]
        if self.dp_size > 1:
            _all_reduce_in_buckets(dense, self.dp_group)
        partial = [g for n, p, g in named if is_per_head_norm(n) or getattr(p, "sequence_parallel", False)]
        if self.tp > 1 and partial:
            _all_reduce_in_buckets(partial, self.tp_group)
        if experts and dist.get_world_size(self.expert_dp_group) > 1:
            _all_reduce_in_buckets(experts, self.expert_dp_group)
        copy = None  # the last stage's copy of a tied embedding, counted on the first stage
        if self.tied and self.pp > 1 and (self.pp_rank == 0 or self.is_last_stage):
            from megatron.core import parallel_state

            model: Any = self.model
            shared = model.shared_embedding_or_output_weight()
            dist.all_reduce(shared.grad, group=parallel_state.get_embedding_group())
            copy = shared if self.pp_rank != 0 else None
        squares = torch.zeros((), dtype=torch.float32, device=self.device)
        expert_squares = torch.zeros((), dtype=torch.float32, device=self.device)
        for name, p, grad in named:
            if is_expert_weight(name):
                expert_squares += grad.float().square().sum()
            elif p is not copy and (getattr(p, "tensor_model_parallel", False) or self.tp_rank == 0):
                squares += grad.float().square().sum()
        dist.all_reduce(squares, group=self.tp_group)
        if experts and self.ep > 1:
            dist.all_reduce(expert_squares, group=self.ep_group)
        total = squares + expert_squares
        if self.pp > 1:
            dist.all_reduce(total, group=self.pp_group)
        norm = float(total.sqrt())
        grads = [grad for _, _, grad in named]
        if self.args.clip_grad and self.args.clip_grad > 0:
            scale = self.args.clip_grad / (norm + 1e-6)
            if scale < 1.0:
                torch._foreach_mul_(grads, scale)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    # ------------------------------------------------------------------ weights and checkpoints

    def weights(self) -> Mapping[str, Any]:
        """The whole model in Hugging Face format on rank 0; ``{}`` on the others (every bucket of
        :meth:`weight_buckets` put together: syncs that can send buckets take those instead)."""
        whole: dict[str, torch.Tensor] = {}
        for bucket in self.weight_buckets(self.args.update_weight_buffer_size):
            whole.update(bucket)
        return whole

    def weight_buckets(self, bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
        """The model in Hugging Face format on rank 0, in buckets of about ``bucket_bytes`` (counted whole:
        gathered over tensor and expert parallel ranks), in order; nothing on the other ranks, which must
        run it to the end too. Each stage gathers and converts one bucket at a time; the first stage's
        buckets come first, then each later stage's, sent to rank 0 one tensor at a time. No rank holds
        more of the whole model than a bucket or two beside its own shard."""
        state = {k: v for k, v in self.model.state_dict().items() if not k.endswith("_extra_state")}
        sizes = ((name, self._whole_bytes(name, tensor)) for name, tensor in state.items())
        mine = (self._hf_bucket({n: state[n] for n in names}) for names in byte_buckets(sizes, bucket_bytes))
        if self.tp_rank != 0 or self.dp_rank != 0:
            for _ in mine:  # the gathers this rank takes part in
                pass
            return
        if self.pp_rank != 0:
            self._send_to_first_stage(mine)
            return
        yield from (bucket for bucket in mine if bucket)
        yield from self._from_later_stages()

    def _whole_bytes(self, name: str, tensor: torch.Tensor) -> int:
        """Bytes of weight ``name`` once gathered from its tensor- and expert-parallel shards."""
        shards = (self.tp if tensor_parallel_dim(name) is not None else 1) * (
            self.ep if is_expert_weight(name) else 1
        )
        return tensor.numel() * tensor.element_size() * shards

    def _hf_bucket(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This stage's weights ``state`` gathered whole (collective over tensor and expert parallel
        ranks) and converted to Hugging Face names; ``{}`` except on tensor- and data-parallel rank 0."""
        if self.tp > 1:
            state = merge_tensor_parallel(self._gather_shards(state))
        if self.ep > 1:
            state = self._gather_experts(state)
        if self.tp_rank != 0 or self.dp_rank != 0:
            return {}
        per_stage = self.hf_config["num_hidden_layers"] // self.pp
        state = pipeline_stage_to_whole(state, self.pp_rank, self.pp, per_stage, self.tied)
        return megatron_to_hf(pad_vocab(state, self.vocab_size), self.hf_config)

    def _send_to_first_stage(self, buckets: Iterator[dict[str, torch.Tensor]]) -> None:
        """A later stage's buckets to rank 0: each bucket's names, shapes and dtypes, then its tensors; an
        empty listing ends the stage."""
        import torch.distributed as dist

        first = dist.get_process_group_ranks(self.pp_group)[0]
        for bucket in buckets:
            if not bucket:
                continue
            listing = [(name, t.shape, t.dtype) for name, t in bucket.items()]
            dist.send_object_list([listing], dst=first, group=self.pp_group, device=self.device)
            for tensor in bucket.values():
                dist.send(tensor.contiguous(), dst=first, group=self.pp_group)
        dist.send_object_list([[]], dst=first, group=self.pp_group, device=self.device)

    def _from_later_stages(self) -> Iterator[dict[str, torch.Tensor]]:
        """Rank 0: the buckets :meth:`_send_to_first_stage` sends, stage after stage."""
        import torch.distributed as dist

        for source in dist.get_process_group_ranks(self.pp_group)[1:]:
            while True:
                box: list[Any] = [None]
                dist.recv_object_list(box, src=source, group=self.pp_group, device=self.device)
                if not box[0]:
                    break
                bucket: dict[str, torch.Tensor] = {}
                for name, shape, dtype in box[0]:
                    bucket[name] = torch.empty(shape, dtype=dtype, device=self.device)
                    dist.recv(bucket[name], src=source, group=self.pp_group)
                yield bucket

    def _gather_experts(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every expert-parallel rank's experts, one tensor at a time, under their whole-model names."""
        import torch.distributed as dist

        per_rank = ModelShape.from_hf(self.hf_config).num_experts // self.ep
        whole: dict[str, torch.Tensor] = {}
        for name, tensor in state.items():
            if not is_expert_weight(name):
                whole[name] = tensor
                continue
            parts = [torch.empty_like(tensor) for _ in range(self.ep)]
            dist.all_gather(parts, tensor.contiguous(), group=self.ep_group)
            for rank, part in enumerate(parts):
                whole[global_expert_name(name, rank, per_rank)] = part
        return whole

    def _gather_shards(self, state: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        import torch.distributed as dist

        shards: list[dict[str, torch.Tensor]] = [{} for _ in range(self.tp)]
        for name, tensor in state.items():
            parts = [tensor] * self.tp
            if tensor_parallel_dim(name) is not None:
                parts = [torch.empty_like(tensor) for _ in range(self.tp)]
                dist.all_gather(parts, tensor.contiguous(), group=self.tp_group)
            for shard, part in zip(shards, parts, strict=True):
                shard[name] = part
        return shards

    def save_hf_model(self, folder: Path) -> None:
        """A Hugging Face folder written by rank 0 one bucket of ``update_weight_buffer_size`` at a time:
        ``model.safetensors`` for a model of one bucket, else one file per bucket with
        ``model.safetensors.index.json``."""
        from safetensors.torch import save_file

        buckets = self.weight_buckets(self.args.update_weight_buffer_size)
        if not self.is_first_rank:
            for _ in buckets:
                pass
            return
        folder.mkdir(parents=True, exist_ok=True)
        files: list[tuple[Path, list[str]]] = []
        total = 0
        for number, bucket in enumerate(buckets, start=1):
            # Copies: the split q, k, v (and gate, up) are views of one tensor, which safetensors refuses.
            state = {k: v.detach().to("cpu", copy=True) for k, v in bucket.items()}
            if self.tied:
                state.pop("lm_head.weight", None)
            path = folder / f"model-part-{number:05d}.safetensors"
            save_file(state, str(path), metadata={"format": "pt"})
            files.append((path, list(state)))
            total += sum(t.numel() * t.element_size() for t in state.values())
        if len(files) == 1:
            files[0][0].rename(folder / MODEL_FILE)
        else:
            weight_map = {}
            for number, (path, names) in enumerate(files, start=1):
                name = f"model-{number:05d}-of-{len(files):05d}.safetensors"
                path.rename(folder / name)
                weight_map.update(dict.fromkeys(names, name))
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (folder / INDEX_FILE).write_text(json.dumps(index, indent=2))
        (folder / "config.json").write_text(json.dumps(self.hf_config, indent=2))
        self.tokenizer.save_pretrained(folder)

    def save_checkpoint(self, folder: Path) -> None:
        """The model in Hugging Face format (rank 0), each rank's optimizer and random states (rank 0's in
        ``folder``, rank r's in ``folder/rank-<r>``) and the parallel sizes they belong to."""
        import torch.distributed as dist

        self.save_hf_model(folder)
        rank_folder = self._rank_folder(folder)
        rank_folder.mkdir(parents=True, exist_ok=True)
        self._save_optimizer_and_rng(rank_folder)
        if self.is_first_rank:
            (folder / PARALLEL_FILE).write_text(json.dumps(self._parallel_sizes()))
        dist.barrier()  # every rank's files are written before rank 0 returns

    def load_checkpoint(self, folder: Path) -> None:
        saved = json.loads((folder / PARALLEL_FILE).read_text()) if (folder / PARALLEL_FILE).exists() else {}
        if saved:
            saved.setdefault("expert", 1)  # written before expert parallelism
            saved.setdefault("pipeline", 1)  # and before pipeline parallelism
        if saved and saved != self._parallel_sizes():
            raise ValueError(
                f"rlsdk-megatron: {folder} was saved with parallel sizes {saved}, this run has "
                f"{self._parallel_sizes()}: resume with the same sizes"
            )
        converted = hf_to_megatron(read_hf_weights(folder, self.stage_weights), self.hf_config)
        shard = shard_of(
            pad_vocab(converted, self.model.vocab_size),
            self.hf_config,
            (self.tp_rank, self.tp),
            (self.ep_rank, self.ep),
            (self.pp_rank, self.pp),
        )
        self.model.load_state_dict(shard, strict=False)
        rank_folder = self._rank_folder(folder)
        if not (rank_folder / OPTIMIZER_FILE).exists():
            raise FileNotFoundError(f"rlsdk-megatron: {rank_folder} holds no {OPTIMIZER_FILE} for this rank")
        self._load_optimizer_and_rng(rank_folder)

    def close(self) -> None:
        """Forget megatron's parallel groups (the process group is its owner's to destroy)."""
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()

    def _rank_folder(self, folder: Path) -> Path:
        import torch.distributed as dist

        return folder if self.is_first_rank else folder / f"rank-{dist.get_rank()}"

    def _parallel_sizes(self) -> dict[str, int]:
        return {"tensor": self.tp, "pipeline": self.pp, "data": self.dp_size, "expert": self.ep}


def _all_reduce_in_buckets(tensors: list[torch.Tensor], group: Any) -> None:
    """Sum ``tensors`` over ``group`` in place, a few flat buckets at a time (one dtype per bucket)."""
    import torch.distributed as dist

    bucket: list[torch.Tensor] = []
    for i, tensor in enumerate(tensors):
        bucket.append(tensor)
        last = i + 1 == len(tensors)
        if last or sum(t.numel() for t in bucket) >= GRADIENT_BUCKET or tensors[i + 1].dtype != tensor.dtype:
            flat = torch.cat([t.flatten() for t in bucket])
            dist.all_reduce(flat, group=group)
            torch._foreach_copy_(
                bucket,
                [
                    part.view_as(t)
                    for part, t in zip(flat.split([t.numel() for t in bucket]), bucket, strict=True)
                ],
            )
            bucket = []
