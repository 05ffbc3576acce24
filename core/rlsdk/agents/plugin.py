"""Core's agent plugins: the ``json``, ``hermes`` and ``mistral`` tool-call parsers and the ``openai_agent`` and
``anthropic_agent`` generators."""

from __future__ import annotations

from ..plugins.hookspecs import hookimpl
from ..plugins.kinds import CustomGenerate
from .anthropic_agent import anthropic_agent
from .openai_agent import openai_agent
from .tool_parsers import builtin_parsers


@hookimpl
def rlsdk_tool_call_parsers():
    yield from builtin_parsers()


@hookimpl
def rlsdk_custom_generates():
    yield CustomGenerate(name="openai_agent", func=openai_agent)
    yield CustomGenerate(name="anthropic_agent", func=anthropic_agent)
