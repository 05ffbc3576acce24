"""slime's command-line arguments that slime's rollout code and examples read but rlsdk has no option
for, with slime's defaults: ``args.<name>`` answers them (a config file or ``extra`` may set them), so a
slime function that reads, say, ``args.sglang_dp_size`` runs unchanged. rlsdk's one engine behind one
URL is slime's single data-parallel engine without Ray (``rollout_num_engines`` 1)."""

from __future__ import annotations

from typing import Any

SLIME_ARG_DEFAULTS: dict[str, Any] = {
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
