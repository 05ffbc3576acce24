"""The tool agent on the real small model (SmolLM2-135M-Instruct): token-exact samples across turns, and
training through ``rlsdk run --custom-generate openai_agent``."""

from __future__ import annotations

import json

import openai
import pytest

from rlsdk import RolloutConfig
from rlsdk.agents.openai_agent import fill_sample
from rlsdk.testing import ServedEngine
from rlsdk_tool_agent.agent import EXAMPLES, SYSTEM, TOOLS, run_tool
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


async def three_turns(client) -> list:
    """The tool agent's loop, kept going for three model turns whatever the model says: tool results for
    its calls, a nudge when it answers."""
    messages = [
        {"role": "system", "content": SYSTEM},
        *EXAMPLES,
        {"role": "user", "content": "What is 37 * 91?"},
    ]
    for _ in range(3):
        reply = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, max_tokens=24
        )
        message = reply.choices[0].message
        messages.append(message)
        for call in message.tool_calls or []:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": run_tool(call.function.name, json.loads(call.function.arguments)),
                }
            )
        if not message.tool_calls:
            messages.append({"role": "user", "content": "Check it with the calculator."})
    return messages


def test_samples_are_token_exact_where_retokenising_the_transcript_is_not():
    """Sessions at temperature 1 (seeded) until one whose transcript, re-tokenised through the chat
    template, gives other ids than the model sampled; that session's sample must still hold exactly the
    sampled ids: every turn's prompt is the previous turn's prompt and sampled ids plus the new messages,
    each model turn's ids decode to the message the agent got, and only model ids train."""
    from rlsdk_embedded import EmbeddedEngine

    async def sessions(served):
        chat = served.handle.chat
        server_url = served.url
        found = []
        for seed in range(12):
            session = chat.sessions.open(
                sampling={"temperature": 1.0, "sampling_seed": seed}, max_response_tokens=400
            )
            client = openai.AsyncOpenAI(
                base_url=f"{server_url}/sessions/{session.id}/v1", api_key="-", max_retries=0
            )
            await three_turns(client)
            trajectory = session.trajectory()
            transcript = session.turns[-1].path_messages(0)
            retokenised = chat.template.encode(
                chat.template.render(transcript, TOOLS, add_generation_prompt=False)
            )
            if retokenised[: len(trajectory.tokens)] != trajectory.tokens:
                found.append(session)
                break
        return chat, found

    with ServedEngine(EmbeddedEngine(device="cpu", max_batch_size=8)) as served:
        chat, found = served.run(sessions(served))
    assert found, "no seed gave a transcript that re-tokenises differently"
    session = found[0]
    tokenizer = served.engine.tokenizer
    assert len(session.turns) == 3 and session.forks() == []
    sample = fill_sample(_sample(), session, tokenizer, _agent(), {"answer": None}, "test")
    trajectory = session.trajectory()
    assert sample.tokens == trajectory.tokens and sample.response_length == len(sample.loss_mask)
    assert len(sample.rollout_log_probs) == sample.response_length
    offset = trajectory.prompt_length
    assert sample.tokens[:offset] == chat.template.encode(
        chat.template.render(session.turns[0].messages, TOOLS, add_generation_prompt=True)
    )
    for turn in session.turns:
        choice = turn.choices[0]
        assert turn.prompt_ids == sample.tokens[: len(turn.prompt_ids)]  # earlier turns' ids, reused exactly
        start = len(turn.prompt_ids) - offset
        assert sample.loss_mask[start : start + len(choice.output_ids)] == [1] * len(choice.output_ids)
        assert sample.rollout_log_probs[start : start + len(choice.output_ids)] == choice.logprobs
        text = tokenizer.decode(choice.output_ids, skip_special_tokens=True)
        parsed = chat.parser.func(text, TOOLS)
        given = choice.message
        assert (parsed.content, [(c.name, c.arguments) for c in parsed.calls]) == (
            given["content"],
            [(c["name"], c["arguments"]) for c in given.get("tool_calls", [])],
        )
    assert sum(sample.loss_mask) == sum(len(t.choices[0].output_ids) for t in session.turns)


def _sample():
    from rlsdk import Sample

    return Sample(prompt="What is 37 * 91?")


def _agent():
    from rlsdk import Agent
    from rlsdk.plugins.records import PluginInfo, Resolved
    from rlsdk_tool_agent.agent import tool_agent

    return Resolved(Agent(name="tool_agent", func=tool_agent), PluginInfo("tool_agent"))


@pytest.mark.timeout(600)
def test_rlsdk_run_trains_the_agent_with_token_exact_samples(tmp_path):
    """``rlsdk run --custom-generate openai_agent --set agent_function_path=tool_agent`` on the embedded
    engine, with a train step: samples come from the sessions, no false forks, the fork rate reported."""
    from rlsdk.run.job import run_job

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

    from rlsdk import Sample, get_plugin_manager
    from rlsdk.agents.anthropic_agent import anthropic_agent
    from rlsdk.runtime import Runtime, bind_runtime

    pm = get_plugin_manager()
    args = RolloutConfig.from_dict({"agent_function_path": "tool_agent_anthropic", "max_turns": 2})
    with ServedEngine(EmbeddedEngine(device="cpu", max_batch_size=8)) as served:
        runtime = Runtime(pm, served.engine, served.engine.tokenizer, loop=served._loop)
        runtime.server = served.handle
        bind_runtime(args, runtime)
        sample = Sample(group_index=0, index=0, prompt="What is 37 * 91?")
        sample = served.run(anthropic_agent(args, sample, {"temperature": 0.0, "max_new_tokens": 200}))
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
