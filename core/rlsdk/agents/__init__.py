"""Agents: an OpenAI-compatible chat endpoint on every engine, sessions that record each turn's tokens
exactly, and the ``openai_agent`` custom_generate that trains agents written with the ``openai`` client.

The HTTP parts (:mod:`.server`, :mod:`.completions`) load aiohttp only when imported. Internal: plugins
import the public names from ``rlsdk``."""

from .tool_parsers import FunctionCall, ParsedTurn

__all__ = ["FunctionCall", "ParsedTurn"]
