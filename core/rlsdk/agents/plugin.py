"""Core's agent plugins: the ``json`` and ``hermes`` tool-call parsers, the ``openai_agent`` generator, and the
``verifiers`` agent and reward that run verifiers environments."""

from __future__ import annotations

from ..plugins.hookspecs import hookimpl
from ..plugins.records import Agent, CustomGenerate, Option, Reward
from ..plugins.verifiers_envs import VERIFIERS_OPTION
from .openai_agent import openai_agent
from .tool_parsers import builtin_parsers
from .verifiers_agent import verifiers_agent, verifiers_reward


@hookimpl
def rlsdk_tool_call_parsers():
    yield from builtin_parsers()


@hookimpl
def rlsdk_custom_generates():
    yield CustomGenerate(name="openai_agent", func=openai_agent)


@hookimpl
def rlsdk_agents():
    yield Agent(name="verifiers", func=verifiers_agent, description="A verifiers environment's rollout")


@hookimpl
def rlsdk_rewards():
    yield Reward(
        name="verifiers", func=verifiers_reward, cheap=True, description="A verifiers rubric's score"
    )


@hookimpl
def rlsdk_options():
    yield Option(
        VERIFIERS_OPTION, str, help="The verifiers environment module (rlsdk run --env MODULE sets it)."
    )
