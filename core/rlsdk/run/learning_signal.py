"""Steps with no learning signal: every group's rewards equal, so GRPO's advantages are all zero and the step
trains nothing. Said on the terminal as the step ends, with the likely cause, and again in the run's summary."""

from __future__ import annotations

from typing import Any

from ..config import RolloutConfig


def no_signal(args: RolloutConfig, metrics: dict[str, Any]) -> str | None:
    """What is wrong with step metrics whose every group got equal rewards (no reward spread anywhere), with
    the likely cause; None where some group's rewards differ, or no reward was scored."""
    low, high = metrics.get("rollout/reward_min"), metrics.get("rollout/reward_max")
    if low is None or high is None or metrics.get("rollout/groups_with_spread"):
        return None
    n = args.n_samples_per_prompt
    if n < 2 and low != high:
        return None  # one sample per prompt: groups have no spread to have, and the step's rewards differ
    if low == high:
        what = f"every reward is {low:g}"
    else:
        what = f"each group's {n} samples got one reward (from {low:g} to {high:g} across groups)"
    return f"no learning signal: {what}; equal rewards give GRPO nothing to learn. Likely cause: {cause(args, metrics)}"


def cause(args: RolloutConfig, metrics: dict[str, Any]) -> str:
    """The likeliest reason for a step with no reward spread, from its metrics and the run's settings."""
    low, high = metrics["rollout/reward_min"], metrics["rollout/reward_max"]
    samples = metrics.get("rollout/samples") or 0
    if low != high:
        return (
            "each prompt is always solved or never: more samples per prompt (--n-samples-per-prompt) or "
            "prompts of middling difficulty for the model give groups a spread"
        )
    if low > 0:
        return (
            f"every sample earns {low:g}: the task is too easy for the model, or the reward does not depend on "
            "the response"
        )
    if samples and metrics.get("rollout/truncated") == samples:
        return (
            f"every response was cut at --rollout-max-response-len ({args.rollout_max_response_len} tokens) "
            "before it ended: raise it"
        )
    if (
        args.label_key is None
        and not getattr(args, "env", None)
        and not getattr(args, "custom_rm_path", None)
    ):
        return "no --label-key is set: the reward has no answer to compare the responses with"
    if not args.apply_chat_template:
        return (
            "the prompts reach the model without its chat template: a chat model given raw text rarely answers "
            "in the form the reward reads (--apply-chat-template)"
        )
    return (
        "the task is too hard for the model, or the reward does not find the answers in its responses: read "
        f"them with rlsdk view {args.output_dir}"
    )
