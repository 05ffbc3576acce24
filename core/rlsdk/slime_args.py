"""slime's command-line arguments that slime's rollout code and examples read but rlsdk has no option
for, with slime's defaults: ``args.<name>`` answers them (a config file or ``extra`` may set them), so a
slime function that reads, say, ``args.sglang_dp_size`` runs unchanged. rlsdk's one engine behind one
URL is slime's single data-parallel engine without Ray (``rollout_num_engines`` 1)."""

from __future__ import annotations

from typing import Any

SLIME_ROLLOUT_ARGS: dict[str, Any] = {
    "sglang_dp_size": 1,
    "sglang_model_routers": None,
    "sglang_speculative_algorithm": None,
    "router_policy": None,
    "use_distributed_post": False,
    "use_rollout_routing_replay": False,
    "rollout_num_engines": 1,  # slime derives it from its GPUs; rlsdk's run has one engine
    "num_gpus_per_node": 8,
    "context_parallel_size": 1,
    "ci_test": False,
    "dump_details": None,
    "eval_max_context_len": None,
    "eval_max_prompt_len": None,
    "load": None,
    "save": None,
    "max_tokens_per_gpu": None,
    "eval_top_k": None,
    "eval_min_new_tokens": None,
    "eval_input_key": None,
    "eval_label_key": None,
    "eval_tool_key": None,
    "eval_custom_rm_path": None,
    "rollout_global_dataset": True,
}

SLIME_TRAINER_SETTINGS: dict[str, Any] = {
    "accumulate_allreduce_grads_in_fp32": False,
    "attention_backend": "auto",
    "attention_dropout": 0.1,
    "attention_softmax_in_fp32": False,
    "hidden_dropout": 0.1,
    "expert_tensor_parallel_size": None,
    "sequence_parallel": False,
    "recompute_granularity": None,
    "recompute_method": None,
    "recompute_num_layers": None,
    "optimizer_cpu_offload": False,
    "overlap_cpu_optimizer_d2h_h2d": False,
    "use_precision_aware_optimizer": False,
    "balance_data": False,
    "use_dynamic_batch_size": False,
    "actor_num_nodes": 1,
    "train_backend": "megatron",
}
"""Megatron's and slime's trainer-side performance and numerics settings that slime's launch scripts pass
(with Megatron's and slime's defaults): taken so a script's flags work, used by none of rlsdk's trainers (the
``torch`` trainer keeps the model's own dropout and attention; ``--gradient-checkpointing`` is its recompute,
``--trainer`` its backend). ``rlsdk run`` names the ones given."""

SLIME_FIXED_CHOICES: dict[str, str] = {"optimizer": "adam", "lr_decay_style": "constant"}
"""slime's optimizer settings rlsdk's trainers have one answer to (AdamW at a constant learning rate): taken
at that value, any other is an error."""

SLIME_ARG_DEFAULTS: dict[str, Any] = {**SLIME_ROLLOUT_ARGS, **SLIME_TRAINER_SETTINGS, **SLIME_FIXED_CHOICES}
"""Every slime argument ``args`` answers with slime's default."""
