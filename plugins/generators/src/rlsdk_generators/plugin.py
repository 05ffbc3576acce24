"""The hook implementations that register the generators package's plugins: agents and tools."""

from __future__ import annotations


from rlsdk import CustomGenerate, GenerateRollout, Tool, hookimpl

from . import calculator, multi_turn, rollout_buffer, sft


@hookimpl
def rlsdk_custom_generates():
    yield CustomGenerate(name="multi_turn", func=multi_turn.multi_turn)


@hookimpl
def rlsdk_generate_rollouts():
    yield GenerateRollout(name="sft", func=sft.sft, chat_messages=True)
    yield GenerateRollout(name="rollout_buffer", func=rollout_buffer.rollout_buffer, chat_messages=True)


@hookimpl
def rlsdk_tools():
    yield Tool(
        name="calculator",
        func=calculator.calculator,
        parameters={"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
        timeout=5.0,
    )
