"""Stands in for ``slime.rollout.on_policy_distillation`` (on-policy distillation with the teacher on an
SGLang-protocol server): ``reward_func`` (``--custom-rm-path``) asks the teacher at ``args.rm_url`` to score each
sample's tokens (``max_new_tokens: 0`` with ``logprob_start_len: 0``, at the rollout's temperature) and returns
its answer; ``post_process_rewards`` (``--custom-reward-post-process-path``) keeps the teacher's log-probs of the
response tokens in ``sample.teacher_log_probs`` and gives every sample the task reward 0, so the learning
signal is the distillation term alone (``--use-opd``, ``--opd-kl-coef``)."""

from __future__ import annotations

from argparse import Namespace
from typing import Any

from ..types import Sample
from .http_utils import post

__all__ = ["post_process_rewards", "reward_func"]


async def reward_func(args: Namespace, sample: Sample, **kwargs: Any) -> dict[str, Any]:
    """The teacher's answer for the sample's prompt and response tokens (``meta_info.input_token_logprobs``)."""
    payload: dict[str, Any] = {
        "input_ids": list(sample.tokens),
        "sampling_params": {
            "temperature": args.rollout_temperature,
            "max_new_tokens": 0,
            "skip_special_tokens": False,
        },
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    images = (sample.multimodal_inputs or {}).get("images")
    if images:
        payload["image_data"] = list(images)
    return await post(args.rm_url, payload)


def post_process_rewards(
    args: Namespace, samples: list[Sample], **kwargs: Any
) -> tuple[list[float], list[float]]:
    """Each sample's teacher log-probs of its response tokens into ``teacher_log_probs``; rewards of 0."""
    for sample in samples:
        answer = sample.reward
        if not isinstance(answer, dict) or "meta_info" not in answer:
            raise ValueError(
                f"sample {sample.index}: its reward is not the teacher's answer (the reward must be "
                "slime.rollout.on_policy_distillation.reward_func)"
            )
        scored = [entry[0] for entry in answer["meta_info"]["input_token_logprobs"][1:]]
        sample.teacher_log_probs = (
            scored[len(scored) - sample.response_length :] if sample.response_length else []
        )
    zeros = [0.0] * len(samples)
    return zeros, list(zeros)
