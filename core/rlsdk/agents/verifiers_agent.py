"""The agent and reward of a verifiers environment's run: its rollout through the sample's session, and its
rubric's score (see :mod:`rlsdk.plugins.verifiers_envs`, whose settings name them by path)."""

from __future__ import annotations

import math
from typing import Any

from ..plugins.rubric import RUBRIC_METADATA
from ..plugins.verifiers_envs import MODULE_KEY, load_verifiers_environment
from ..types import Sample
from ..config import RolloutConfig


async def verifiers_agent(args: RolloutConfig, sample: Sample, client: Any) -> dict[str, Any]:
    """Run the environment's rollout (single- or multi-turn) with ``client`` and score it with its rubric;
    the result holds the rubric's ``reward`` and each reward function's value (``metrics``)."""
    metadata = sample.metadata or {}
    module = metadata.get(MODULE_KEY)
    if not module:
        raise ValueError(
            f"the sample's metadata names no verifiers environment ({MODULE_KEY}): run with --env MODULE"
        )
    from verifiers.clients import OpenAIChatCompletionsClient  # verifiers is optional: only a verifiers run

    env = load_verifiers_environment(module)
    rollout_input = {
        "prompt": sample.prompt,
        "example_id": metadata.get("example_id", sample.index),
        "answer": "" if sample.label is None else str(sample.label),
        **{key: metadata[key] for key in ("info", "task") if key in metadata},
    }
    output = await env.run_rollout(rollout_input, OpenAIChatCompletionsClient(client), "policy", {})
    error = output.get("error")
    return {
        "reward": output.get("reward"),
        "metrics": {k: float(v) for k, v in (output.get("metrics") or {}).items()},
        "error": None if error is None else str(error),
    }


def verifiers_reward(args: RolloutConfig, sample: Sample, **kwargs: Any) -> float | None:
    """The rubric's score of the sample's rollout, each part logged; no score (the rollout failed, or another
    generator made the sample) makes the sample invalid, never 0."""
    result = ((sample.metadata or {}).get("agent") or {}).get("result")
    if not isinstance(result, dict) or result.get("reward") is None:
        return None
    if result.get("error"):
        raise ValueError(f"the verifiers rollout failed: {result['error']}")
    sample.metadata[RUBRIC_METADATA] = dict(result.get("metrics") or {})
    reward = float(result["reward"])
    return reward if math.isfinite(reward) else None
