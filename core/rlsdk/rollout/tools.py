"""Calling tool plugins from multi-turn generators: by name, with each tool's timeout, errors as text."""

from __future__ import annotations

import asyncio
import inspect
import json
import warnings
from dataclasses import dataclass
from typing import Any

from ..aio.blocking import blocking_pool
from ..plugins.kinds import Tool
from ..runtime import plugins_of
from ..config import RolloutConfig


@dataclass
class ToolResult:
    """What a tool call gave: the observation text, and the error when it failed."""

    name: str
    text: str
    error: str | None = None


def resolve_tools(args: RolloutConfig, names: list[str]) -> dict[str, Tool]:
    """The tool records of ``names`` from the run's plugins (an unknown name lists the installed)."""
    return plugins_of(args).tools(names)


async def call_tool(tool: Tool, args: RolloutConfig, arguments: dict[str, Any]) -> ToolResult:
    """Run ``tool`` with ``arguments`` within its timeout (the call point's order: the plugin first, then what
    it is called with). A tool that raises, hangs or returns something unprintable gives an ``Error: ...``
    observation instead of an exception. ``call_tool(args, tool, arguments)``, the 0.2 order, still works and
    warns."""
    if not isinstance(tool, Tool) and isinstance(args, Tool):
        warnings.warn(
            "call_tool(args, tool, arguments) is deprecated and will be removed in 0.4: "
            "use rlsdk.call_tool(tool, args, arguments)",
            DeprecationWarning,
            stacklevel=2,
        )
        tool, args = args, tool
    try:
        if inspect.iscoroutinefunction(tool.func):
            call = tool.func(args, **arguments)
        else:
            call = blocking_pool().run(tool.func, args, **arguments)  # abandoned if it hangs
        value = await asyncio.wait_for(call, timeout=tool.timeout)
        if isinstance(value, str):
            return ToolResult(tool.name, value)
        return ToolResult(tool.name, "" if value is None else json.dumps(value, default=str))
    except asyncio.TimeoutError:
        error = f"tool {tool.name!r} timed out after {tool.timeout:g}s"
    except Exception as exc:  # a failing tool is an observation for the model, not a crash
        error = f"tool {tool.name!r} failed: {type(exc).__name__}: {exc}"
    return ToolResult(tool.name, f"Error: {error}", error)
