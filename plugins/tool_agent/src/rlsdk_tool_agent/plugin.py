"""The tool agent's hook implementations: the ``tool_agent`` (openai client) and ``tool_agent_anthropic``
(anthropic client) agents and their ``tool_agent_answer`` reward."""

from __future__ import annotations

from pathlib import Path

from rlsdk import Agent, Reward, hookimpl

from .agent import tool_agent
from .anthropic_agent import tool_agent_anthropic
from .reward import tool_agent_answer

QUESTIONS = Path(__file__).parent / "data" / "questions.jsonl"
"""Questions that need the calculator or the notes, with labels."""


@hookimpl
def rlsdk_agents():
    yield Agent(name="tool_agent", func=tool_agent, multi_turn=True)
    yield Agent(name="tool_agent_anthropic", func=tool_agent_anthropic, multi_turn=True)


@hookimpl
def rlsdk_rewards():
    yield Reward(name="tool_agent_answer", func=tool_agent_answer, cheap=True)
