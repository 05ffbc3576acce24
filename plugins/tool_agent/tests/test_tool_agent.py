"""The tool agent on the real small model (SmolLM2-135M-Instruct): token-exact samples across turns, and
training through ``rlsdk run --custom-generate openai_agent``."""

from __future__ import annotations

import json

import pytest

from rlsdk import RolloutConfig
from rlsdk.testing import ServedEngine
from rlsdk_tool_agent.plugin import QUESTIONS

pytestmark = pytest.mark.slow


def test_listed_by_rlsdk_plugins():
    from typer.testing import CliRunner

    from rlsdk_cli.app import app

    listed = json.loads(CliRunner().invoke(app, ["plugins", "list", "--json"]).stdout)
    mine = next(row for row in listed if row["distribution"] == "rlsdk-tool-agent")
    assert mine["provides"] == {
        "agent": ["tool_agent", "tool_agent_anthropic"],
        "reward": ["tool_agent_answer"],
    }


@pytest.mark.timeout(600)
def test_rlsdk_run_trains_the_agent_with_token_exact_samples(tmp_path):
    """``rlsdk run --custom-generate openai_agent --set agent_function_path=tool_agent`` on the embedded
    engine, with a train step: samples come from the sessions, no false forks, the fork rate reported."""
    from rlsdk import run_job

    args = RolloutConfig.from_dict(
        {
            "custom_generate_function_path": "openai_agent",
            "agent_function_path": "tool_agent",
            "rm_type": "tool_agent_answer",
            "prompt_data": f"{QUESTIONS}@[0:2]",
            "label_key": "label",
            "num_rollout": 1,
            "rollout_batch_size": 1,
            "n_samples_per_prompt": 2,
            "rollout_max_response_len": 32,
            "max_turns": 1,
            "output_dir": str(tmp_path),
            "engine_device": "cpu",
            "train": True,
            "global_batch_size": 2,
            "eval_interval": None,
        }
    )
    run_job(args)
    metrics = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert (
        metrics["agent/sessions"] == 2 and metrics["agent/forks"] == 0 and metrics["agent/fork_rate"] == 0.0
    )
    assert "train/loss" in metrics
    for line in (tmp_path / "rollouts.jsonl").read_text().splitlines():
        sample = json.loads(line)
        agent = sample["metadata"]["agent"]
        assert agent["name"] == "tool_agent" and agent["messages"][-1]["role"] == "assistant"
        assert len(sample["loss_mask"]) == len(sample["rollout_log_probs"]) == sample["response_length"]
        assert 0 < sum(sample["loss_mask"]) <= sample["response_length"]


def test_the_anthropic_client_agent_runs_through_anthropic_agent():
    """``tool_agent_anthropic`` (the same agent written with the ``anthropic`` client) under the
    ``anthropic_agent`` custom_generate on the embedded engine: a token-exact sample from its session, the
    tools' results between its turns, nothing forked."""
    from rlsdk_embedded import EmbeddedEngine

    from rlsdk import get_plugin_manager
    from rlsdk.testing import check_agent

    args = RolloutConfig.from_dict({"max_turns": 2})
    with ServedEngine(EmbeddedEngine(device="cpu", max_batch_size=8)) as served:
        sample = check_agent(
            get_plugin_manager(),
            "tool_agent_anthropic",
            served,
            args,
            prompt="What is 37 * 91?",
            generator="anthropic_agent",
            sampling_params={"temperature": 0.0, "max_new_tokens": 200},
        )
    agent = sample.metadata["agent"]
    assert agent["name"] == "tool_agent_anthropic" and agent["forks"] == [] and agent["turns"] >= 1
    assert agent["result"]["tool_calls"] >= 1  # greedy, after the worked examples, it calls a tool
    response = served.engine.tokenizer.decode(sample.tokens[-sample.response_length :])
    asked = max(i for i, m in enumerate(agent["messages"]) if m["role"] == "user")  # after the examples
    observations = [m["content"] for m in agent["messages"][asked:] if m["role"] == "tool"]
    assert observations and all(o in response for o in observations)  # the tools' results, between turns
    tree = agent["tree"]
    assert [t for i in tree["trained"] for t in tree["nodes"][i]["tokens"]] == sample.tokens
    assert len(sample.loss_mask) == sample.response_length == len(sample.rollout_log_probs)
