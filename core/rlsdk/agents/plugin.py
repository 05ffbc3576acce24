"""Core's agent plugins: the ``json``, ``hermes`` and ``mistral`` tool-call parsers and the ``openai_agent`` and
``anthropic_agent`` generators."""

from __future__ import annotations

from ..plugins.hookspecs import hookimpl
from ..plugins.records import CustomGenerate, ToolCallParser
from . import tool_parsers
from .anthropic_agent import anthropic_agent
from .openai_agent import openai_agent


@hookimpl
def rlsdk_tool_call_parsers():
    yield ToolCallParser(
        name="json",
        func=tool_parsers.parse_json,
        marker="{",
        format_calls=tool_parsers.format_json,
        tools_prompt=tool_parsers.json_tools_prompt,
        description='A JSON object {"name": ..., "arguments": {...}} per call (small models)',
    )
    yield ToolCallParser(
        name="hermes",
        func=tool_parsers.parse_hermes,
        marker="<tool_call>",
        format_calls=tool_parsers.format_hermes,
        tools_prompt=tool_parsers.hermes_tools_prompt,
        description="<tool_call>{...}</tool_call> blocks (Hermes and Qwen chat templates)",
    )
    yield ToolCallParser(
        name="mistral",
        func=tool_parsers.parse_mistral,
        marker="[",
        format_calls=tool_parsers.format_mistral,
        tools_prompt=tool_parsers.mistral_tools_prompt,
        description="[TOOL_CALLS][{...}, ...]: a JSON array of calls (Mistral chat templates)",
    )


@hookimpl
def rlsdk_custom_generates():
    yield CustomGenerate(name="openai_agent", func=openai_agent)
    yield CustomGenerate(name="anthropic_agent", func=anthropic_agent)
