"""The ``multi_turn`` generator: model turns and tool calls until an answer, a turn limit or the
context limit. Model tokens keep the engine's log-probs (loss mask 1); tool observations get loss mask 0.
"""

from __future__ import annotations

from typing import Any

from rlsdk import (
    Sample,
    Tool,
    ToolResult,
    append_observation,
    call_tool,
    get_runtime,
    model_turn,
    resolve_tools,
)

from .chat_mask import render
from .tool_calls import ToolCall, parse_tool_calls


def tool_names(args: Any, sample: Sample) -> list[str]:
    """``args.tool_names``, else the names of the sample's tool definitions (``metadata["tools"]``)."""
    if args.tool_names:
        return list(args.tool_names)
    names: list[str] = []
    for tool in sample.metadata.get("tools") or []:
        name = (
            tool
            if isinstance(tool, str)
            else (tool.get("function") or tool).get("name")
            if isinstance(tool, dict)
            else None
        )
        if name:
            names.append(name)
    return names


def tag_observation(results: list[ToolResult]) -> str:
    """Tag-style results, each wrapped as ``<result>...</result>``."""
    return "".join(f"\n<result>\n{r.text}\n</result>\n" for r in results)


def chat_observation(args: Any, sample: Sample, results: list[ToolResult]) -> str:
    """JSON-style results as ``tool`` messages through the chat template, up to the next assistant
    turn's generation prompt, after the end-of-turn token the model already produced."""
    tokenizer = get_runtime(args).tokenizer
    marker = "\u2063turn\u2063"
    base = [{"role": "user", "content": "."}, {"role": "assistant", "content": marker}]
    tool_messages = [{"role": "tool", "name": r.name, "content": r.text} for r in results]
    kwargs = getattr(args, "apply_chat_template_kwargs", None) or {}
    before = render(tokenizer, base, **kwargs)
    after = render(tokenizer, base + tool_messages, add_generation_prompt=True, **kwargs)
    cut = before.index(marker) + len(marker)
    if not after.startswith(before[:cut]):
        raise ValueError(
            "the chat template renders tool messages by rewriting the assistant turn before them"
        )
    text = after[cut:]
    if sample.response_length and sample.tokens[-1] in tokenizer.all_special_ids:
        end_of_turn = tokenizer.decode(sample.tokens[-1:])
        if text.startswith(end_of_turn):
            return text[len(end_of_turn) :]
    return text


async def run_calls(args: Any, tools: dict[str, Tool], calls: list[ToolCall]) -> list[ToolResult]:
    results = []
    for call in calls:
        if call.error:
            results.append(ToolResult(call.name, f"Error: {call.error}", call.error))
        else:
            results.append(await call_tool(tools[call.name], args, call.arguments))
    return results


async def multi_turn(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Multi-turn tool use: loop model turn, tool calls, observation until the model answers without
    a call, ``args.max_turns`` or the token budget. An aborted turn returns the partial sample; calling
    again resumes it."""
    tools = resolve_tools(args, tool_names(args, sample))
    state = sample.metadata.setdefault(
        "multi_turn", {"turns": 0, "tool_calls": 0, "tool_errors": [], "partial_turn": ""}
    )
    style = args.tool_call_format
    stop = [f"</{name}>" for name in tools] if style in ("tag", "auto") else []
    while state["turns"] < args.max_turns:
        state["partial_turn"] += await model_turn(args, sample, sampling_params, stop=stop)
        if sample.status == Sample.Status.ABORTED:
            return sample  # resumable: the partial turn's tokens and text are kept
        text, state["partial_turn"] = state["partial_turn"], ""
        state["turns"] += 1
        if sample.status != Sample.Status.COMPLETED:
            return sample  # truncated by the budget, or failed
        calls = parse_tool_calls(text, tools, style)
        if not calls:
            state["stop"] = "answer"
            return sample
        results = await run_calls(args, tools, calls)
        state["tool_calls"] += len(results)
        state["tool_errors"] += [r.error for r in results if r.error]
        if any(c.style == "json" for c in calls):
            observation = chat_observation(args, sample, results)
        else:
            observation = tag_observation(results)
        if not append_observation(args, sample, observation, sampling_params):
            return sample
    state["stop"] = "max_turns"
    sample.status = Sample.Status.TRUNCATED
    return sample
