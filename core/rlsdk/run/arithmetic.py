"""The default demo as an environment: single-digit arithmetic, the data shipped inside core.

``rlsdk run`` with no data runs it (the quick start); ``rlsdk run --env arithmetic`` names it.
"""

from __future__ import annotations

from typing import Any

from ..plugins.loading import package_file

TRAIN_DATA = package_file("rlsdk", "datasets/arithmetic-train.jsonl")
EVAL_DATA = package_file("rlsdk", "datasets/arithmetic-eval.jsonl")
DEMO_TRAINING: dict[str, Any] = {
    "num_rollout": 16,
    "rollout_batch_size": 8,
    "n_samples_per_prompt": 8,
    "lr": 1e-5,
    "global_batch_size": 32,
    "eps_clip_high": 0.28,
    "use_rollout_logprobs": True,
    "rollout_max_response_len": 40,
    "eval_interval": 4,
    "n_samples_per_eval_prompt": 2,
    "rollout_shuffle": True,
    "eval_datasets": [{"name": "arithmetic-eval", "path": EVAL_DATA}],
}
"""With ``--train``: settings that apply unless given (others keep slime's defaults)."""


def settings() -> dict[str, Any]:
    """Single-digit arithmetic prompts with a ``label``, through the chat template, graded by ``math``."""
    return {"prompt_data": TRAIN_DATA, "label_key": "label", "apply_chat_template": True}
