"""The hook implementations that register the generators package's plugins: agents and tools."""

from __future__ import annotations

from rlsdk import CustomGenerate, GenerateRollout, Option, Tool, hookimpl

from . import calculator, multi_turn, rollout_buffer, sft


@hookimpl
def rlsdk_custom_generates():
    yield CustomGenerate(name="multi_turn", func=multi_turn.multi_turn, multi_turn=True)


@hookimpl
def rlsdk_generate_rollouts():
    yield GenerateRollout(name="sft", func=sft.sft, chat_messages=True)
    yield GenerateRollout(name="rollout_buffer", func=rollout_buffer.rollout_buffer, chat_messages=True)


@hookimpl
def rlsdk_tools():
    yield Tool(
        name="calculator",
        func=calculator.calculator,
        parameters={
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
        timeout=5.0,
    )


@hookimpl
def rlsdk_options():
    yield Option(
        "tool_names",
        list,
        [],
        help="Tool plugins the multi_turn generator may call; empty: those "
        "named in the sample's metadata['tools'].",
    )
    yield Option(
        "tool_call_format",
        str,
        "auto",
        choices=("auto", "tag", "json"),
        help="How multi_turn reads "
        "tool calls: tag (<name>...</name>), json (the chat template's <tool_call> JSON) or auto.",
    )
    yield Option(
        "rollout_buffer_url",
        str,
        help="Address of `rlsdk buffer serve` for the rollout_buffer rollout (slime's --rollout-buffer-url).",
    )
    yield Option(
        "rollout_task_type",
        str,
        help="The task_generator plugin the rollout_buffer rollout starts on the buffer service.",
    )
    yield Option(
        "rollout_buffer_wait",
        float,
        600.0,
        help="Seconds the rollout_buffer rollout waits for enough complete groups before failing.",
    )
