"""The agents' kinds (tools, rollout-buffer tasks, tool-call parsers, agents), each declared once as in
:mod:`rlsdk.plugins.kinds.rollout`."""

from __future__ import annotations

from argparse import Namespace

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from ...types import Sample
from ..records import Option, PluginArgs, PluginRecord
from ..tool_schema import schema_from_signature
from ...options import RunOptions


__all__ = [
    "Agent",
    "TaskGenerator",
    "Tool",
    "ToolCallParser",
]


@dataclass
class Tool(PluginRecord):
    """``tool(args, **arguments) -> str`` (sync or async): an action a multi-turn generator may take.
    ``parameters`` is the JSON schema of the arguments; when not given it is built from the callable's
    signature and docstring (type hints, defaults, ``:param x:`` or ``Args:`` lines; a ``**kwargs``-only tool
    takes one string ``query``). A tag-style call ``<name>text</name>`` passes ``text`` as the schema's single
    parameter. A call that runs past ``timeout`` seconds or raises becomes an error observation, never a
    crash.

    The hook provides tools that multi-turn generators (``multi_turn``, agents) may call by name.

    The callable is ``tool(args, **arguments) -> str`` (sync or async); its result is appended to the
    sample as an observation with loss mask 0. A tool that raises or runs past the record's
    ``timeout`` gives an observation with the error instead.

    - ``args``: the run's :class:`rlsdk.RolloutConfig`.
    - ``arguments``: the call's arguments, matching the record's ``parameters`` JSON schema.

    **Example:**

    .. code-block:: python

        from rlsdk import Tool, hookimpl

        def word_count(args, text):
            return str(len(text.split()))

        @hookimpl
        def rlsdk_tools():
            yield Tool(
                name="word_count",
                func=word_count,
                description="Count the words of a text",
                parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
                timeout=5.0,
            )
    """

    kind: ClassVar[str] = "tool"
    scope: ClassVar[str] = "call"
    parameters: dict[str, Any] = field(default_factory=dict)
    timeout: float = 30.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.parameters:
            self.parameters = schema_from_signature(self.func, f"tool {self.name!r}")
        if not (self.timeout > 0):
            raise ValueError(f"tool {self.name!r}: timeout must be positive, got {self.timeout!r}")

    def signature_args(self) -> tuple[str, ...]:
        """``args`` and the schema's required parameters, which the signature must accept."""
        return ("args", *self.parameters.get("required", []))

    @property
    def tag_argument(self) -> str | None:
        """The parameter a tag-style call fills: the only one (or the only required one), else None."""
        names = list(self.parameters.get("properties", {}))
        required = list(self.parameters.get("required", []))
        if len(names) == 1:
            return names[0]
        return required[0] if len(required) == 1 else None

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function definition that chat templates take in ``tools``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


class TaskGeneratorCall(Protocol):
    """``task_generator``'s call."""

    def __call__(self, data: Any, /) -> Any: ...


@dataclass
class TaskGenerator(PluginRecord):
    """``run_rollout(data)``: a rollout-buffer task (slime's ``TASK_TYPE`` module), named by task type.
    ``run_rollout`` gets the ``/start_rollout`` body and posts trajectories to its ``remote_buffer_url``. The
    optional group hooks have slime's signatures: ``is_valid_group((instance_id, items), group_size,
    task_type) -> bool``, ``transform_group((instance_id, items), task_type) -> (instance_id, items)`` and
    ``get_group_data_meta_info({instance_id: items}) -> dict``.

    The hook provides rollout-buffer tasks: agents that produce trajectories outside the trainer.

    The callable is slime's ``run_rollout(data)``: ``rlsdk buffer serve`` runs it in a worker thread
    when a trainer posts ``/start_rollout`` with ``"task_type": <name>``; it posts each finished
    trajectory (``instance_id``, ``uid``, ``messages``, ``reward``, ``extra_info``) to
    ``data["remote_buffer_url"] + "/buffer/write"``. A slime generator module registers unchanged with
    :meth:`rlsdk.TaskGenerator.from_module`.

    - ``data``: the ``/start_rollout`` body: ``task_type``, ``input_file``, ``num_repeat_per_sample``,
        ``remote_engine_url``, ``remote_buffer_url``, ``sampling_params``, ...

    **Example:**

    .. code-block:: python

        import json
        import httpx
        from rlsdk import TaskGenerator, hookimpl

        def run_rollout(data):
            with open(data["input_file"]) as rows:
                for line_no, line in enumerate(rows):
                    row = json.loads(line)
                    for i in range(int(data["num_repeat_per_sample"])):
                        messages = [{"role": "user", "content": row["question"]},
                                    {"role": "assistant", "content": row["answer"]}]
                        httpx.post(data["remote_buffer_url"] + "/buffer/write", json={
                            "instance_id": str(line_no), "uid": f"{line_no}-{i}", "messages": messages,
                            "reward": 1.0, "extra_info": {},
                        })

        @hookimpl
        def rlsdk_task_generators():
            yield TaskGenerator(name="replay_answers", func=run_rollout, description="Replay reference answers")
    """

    kind: ClassVar[str] = "task_generator"
    call_args: ClassVar[tuple[str, ...]] = ("data",)
    scope: ClassVar[str] = "request"
    func: TaskGeneratorCall
    is_valid_group: Callable[..., bool] | None = None
    transform_group: Callable[..., Any] | None = None
    get_group_data_meta_info: Callable[..., dict[str, Any]] | None = None

    @classmethod
    def from_module(cls, module: Any, description: str = "") -> TaskGenerator:
        """A record from a slime generator module: ``TASK_TYPE``, ``run_rollout`` and optional hooks."""
        return cls(
            name=module.TASK_TYPE,
            func=module.run_rollout,
            description=description,
            is_valid_group=getattr(module, "is_valid_group", None),
            transform_group=getattr(module, "transform_group", None),
            get_group_data_meta_info=getattr(module, "get_group_data_meta_info", None),
        )


class ToolCallParserCall(Protocol):
    """``tool_call_parser``'s call."""

    def __call__(self, text: str, tools: list[dict[str, Any]], /) -> Any: ...


@dataclass
class ToolCallParser(PluginRecord):
    """``parse(text, tools) -> rlsdk.agents.ParsedTurn``: the content and tool calls of one model turn, for
    ``/v1/chat/completions``. ``marker`` is the text that starts a call (a stream holds content back from it
    until the turn ends). ``format_calls(calls) -> str`` writes calls back in the model's own format and
    ``tools_prompt(tools) -> str`` describes the tools, for chat templates that render neither (a re-rendered
    history, a system message).

    The hook provides tool-call parsers for ``/v1/chat/completions`` (``--tool-call-parser NAME``).

    The callable is ``parse(text, tools) -> rlsdk.agents.ParsedTurn``: the content and the function calls
    (``name``, ``arguments`` as a dict) of one model turn. The record's ``format_calls`` and
    ``tools_prompt`` write calls and tool definitions in the model's format for chat templates that render
    neither.

    - ``text``: the turn's text, special tokens skipped.
    - ``tools``: the request's ``tools``, OpenAI function definitions.

    **Example:**

    .. code-block:: python

        import json
        from rlsdk import ToolCallParser, hookimpl
        from rlsdk import FunctionCall, ParsedTurn

        def call_lines(text, tools):
            lines = text.splitlines()
            calls = [FunctionCall(**json.loads(line[5:])) for line in lines if line.startswith("CALL ")]
            return ParsedTurn(" ".join(line for line in lines if not line.startswith("CALL ")), calls)

        def write_calls(calls):
            return "\\n".join("CALL " + json.dumps({"name": c.name, "arguments": c.arguments}) for c in calls)

        @hookimpl
        def rlsdk_tool_call_parsers():
            yield ToolCallParser(name="call_lines", func=call_lines, marker="CALL ", format_calls=write_calls)
    """

    kind: ClassVar[str] = "tool_call_parser"
    call_args: ClassVar[tuple[str, ...]] = ("text", "tools")
    scope: ClassVar[str] = "request"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "tool_call_parser",
            str,
            "auto",
            "How `/v1/chat/completions` and `/v1/messages` read tool calls, per model family: a tool_call_parser plugin (`json`, `hermes`) or `auto` (`hermes` for chat templates that write `<tool_call>`, else `json`).",
        ),
    )
    func: ToolCallParserCall

    @classmethod
    def chosen(cls, args: RunOptions | Namespace) -> Any:
        """None for ``auto``: the chat endpoint picks one by the chat template."""
        name = getattr(args, "tool_call_parser", None)
        return None if name == "auto" else name

    marker: str = ""
    format_calls: Callable[..., str] | None = None
    tools_prompt: Callable[..., str] | None = None


class AgentCall(Protocol):
    """``agent``'s call."""

    def __call__(self, args: PluginArgs, sample: Sample, client: Any, /) -> Any: ...


@dataclass
class Agent(PluginRecord):
    """``agent(args, sample, client) -> result`` (sync or async): an agent that talks to the model only through
    ``client``, an ``openai.OpenAI`` (``openai.AsyncOpenAI`` for async agents) bound to the sample's session,
    run by the ``openai_agent`` custom_generate; or the ``anthropic`` client's, run by ``anthropic_agent``.

    The hook provides agents for the ``openai_agent`` and ``anthropic_agent`` custom_generates
    (``--set agent_function_path=NAME``).

    The callable is ``agent(args, sample, client) -> result`` (sync or async) and talks to the model only
    through ``client``: an ``openai.AsyncOpenAI`` (``anthropic.AsyncAnthropic`` under ``anthropic_agent``)
    for async agents, the sync client for sync ones, bound to the sample's session, which records every
    turn's tokens. The result (JSON-ready) and the
    transcript land in ``sample.metadata["agent"]`` for rewards.

    - ``args``: the run's :class:`rlsdk.RolloutConfig`.
    - ``sample``: the :class:`rlsdk.Sample` (its ``prompt``, ``label`` and ``metadata``).
    - ``client``: the OpenAI client bound to the sample's session.

    **Example:**

    .. code-block:: python

        from rlsdk import Agent, hookimpl

        async def ask_twice(args, sample, client):
            messages = [{"role": "user", "content": sample.prompt}]
            first = await client.chat.completions.create(model="policy", messages=messages)
            messages += [first.choices[0].message, {"role": "user", "content": "Are you sure?"}]
            second = await client.chat.completions.create(model="policy", messages=messages)
            return second.choices[0].message.content

        @hookimpl
        def rlsdk_agents():
            yield Agent(name="ask_twice", func=ask_twice, description="Answer, then reconsider")
    """

    kind: ClassVar[str] = "agent"
    call_args: ClassVar[tuple[str, ...]] = ("args", "sample", "client")
    scope: ClassVar[str] = "sample"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "agent_function_path",
            str,
            None,
            "The agent plugin (or dotted path) the `openai_agent` or `anthropic_agent` custom_generate runs for each sample.",
        ),
    )
    func: AgentCall
    multi_turn: bool = False
    """The agent talks to the model more than once a sample (a tool loop): a run in which every sample got
    one model turn is a silent fallback, and its detector warns."""
