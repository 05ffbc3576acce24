"""The ``openai_agent`` custom_generate: runs an agent written with the ``openai`` client against the run's
engine, one session per sample, and turns the session's record into the training sample. The session
runner here serves ``anthropic_agent`` too (:mod:`.anthropic_agent`): only the client differs.

The agent (``args.agent_function_path``: an agent plugin or a dotted path) is called as
``agent(args, sample, client)`` with an ``openai.AsyncOpenAI`` (async agents) or ``openai.OpenAI`` (sync
agents, in a worker thread) whose base URL is the sample's session. Its result and final transcript land in
``sample.metadata["agent"]`` with the session's turns, forks and tree, for rewards and the agent metrics.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..aio.blocking import blocking_pool
from ..engines import run_tokens
from ..engines.protocol import SERVE_TOKEN_ENV
from ..errors import PluginCallError, PluginError
from ..plugins.records import Resolved
from ..runtime import Runtime, get_runtime
from ..types import Sample
from .sessions import Session
from .tree import session_tree
from ..plugins.kinds import Agent
from ..config import RolloutConfig


@dataclass(frozen=True)
class AgentClient:
    """How a custom_generate makes its agent's client: ``make(base_url, token, timeout)`` returns the
    (async, sync) clients; ``path`` follows ``/sessions/<id>`` in a session's base URL."""

    generate: str
    package: str
    make: Callable[[str, str | None, float], tuple[Any, Any]]
    path: str


def _openai_clients(base_url: str, token: str | None, timeout: float) -> tuple[Any, Any]:
    import openai

    options: dict[str, Any] = {"api_key": token or "rlsdk", "max_retries": 0, "timeout": timeout}
    return openai.AsyncOpenAI(base_url=base_url, **options), openai.OpenAI(base_url=base_url, **options)


OPENAI = AgentClient("openai_agent", "openai", _openai_clients, "/v1")


async def openai_agent(args: RolloutConfig, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Run the run's agent for ``sample`` through an OpenAI client bound to a new session; the sample
    gets the session's token-exact trajectory (model tokens loss mask 1, the rest 0)."""
    return await run_session_agent(OPENAI, args, sample, sampling_params)


async def run_session_agent(
    kind: AgentClient, args: RolloutConfig, sample: Sample, sampling_params: dict[str, Any]
) -> Sample:
    """Run the run's agent for ``sample`` with ``kind``'s client bound to a new session."""
    runtime = get_runtime(args)
    state = await _state(kind, args, runtime)
    agent: Resolved = state["agent"]
    where = f"{agent.describe()} on sample {sample.group_index}/{sample.index}"
    session = state["chat"].sessions.open(
        sampling=sampling_params,
        max_response_tokens=sampling_params.get("max_new_tokens"),
        max_context_tokens=getattr(args, "rollout_max_context_len", None),
        label=where,
    )
    base_url = f"{state['url']}/sessions/{session.id}{kind.path}"
    try:
        result = await _run_agent(state, agent, args, sample, base_url)
    except Exception as exc:
        if not session.aborted:
            raise PluginCallError(f"{where} raised {type(exc).__name__}: {exc}") from exc
        result = None
    finally:
        state["chat"].sessions.close(session.id)
    if session.aborted:  # the step ended (or weights changed) mid-conversation: the sample starts over later
        sample.status = Sample.Status.ABORTED
        return sample
    return fill_sample(sample, session, runtime.tokenizer, agent, result, where)


def fill_sample(
    sample: Sample, session: Session, tokenizer: Any, agent: Resolved, result: Any, where: str
) -> Sample:
    """The sample from a finished session: tokens, loss mask and rollout log-probs of the path to the
    latest turn, and ``metadata["agent"]`` (with the session's tree of token segments)."""
    trajectory = session.trajectory()
    if trajectory is None:
        raise PluginCallError(f"{where} made no chat request (chat completion or message) through its client")
    last_turn = session.turns[trajectory.turns[-1][0]]
    sample.tokens = trajectory.tokens
    sample.response_length = len(trajectory.tokens) - trajectory.prompt_length
    sample.loss_mask = trajectory.loss_mask
    sample.rollout_log_probs = trajectory.rollout_log_probs
    sample.response = tokenizer.decode(trajectory.tokens[trajectory.prompt_length :])
    sample.weight_versions.extend(trajectory.weight_versions)
    sample.status = (
        Sample.Status.TRUNCATED if trajectory.finish_reason == "length" else Sample.Status.COMPLETED
    )
    tree = session_tree(session)
    sample.metadata["agent"] = {
        "name": agent.name,
        "result": result,
        "messages": last_turn.path_messages(trajectory.turns[-1][1]),
        "turns": len(session.turns),
        "trajectory_turns": len(trajectory.turns),
        "forks": session.forks(),
        "branches": tree["branches"] if tree else 0,
        "malformed_tool_calls": sum(c.malformed_calls for t in session.turns for c in t.choices),
        "reused_tokens": sum(turn.reused for turn in session.turns),
        "tree": tree,
    }
    return sample


async def _run_agent(
    state: dict[str, Any], agent: Resolved, args: RolloutConfig, sample: Sample, base_url: str
) -> Any:
    if agent.is_async:
        return await agent.func(args, sample, state["async_client"].with_options(base_url=base_url))
    return await blocking_pool().run(
        agent.func, args, sample, state["client"].with_options(base_url=base_url)
    )


async def _state(kind: AgentClient, args: RolloutConfig, runtime: Runtime) -> dict[str, Any]:
    """The run's agent, chat endpoint and clients, made on first use: the run's loopback server's
    endpoint, or (an engine with its own URL, such as SGLang) a chat server in front of the engine."""
    state = runtime.state.get(kind.generate)
    if state is not None:
        return state
    try:
        __import__(kind.package)
    except ImportError:
        raise PluginError(
            f"{kind.generate} needs the {kind.package} package: pip install 'rlsdk[agents]'"
        ) from None
    agent = runtime.plugins.get(Agent)
    if agent is None:
        raise PluginError(
            f"{kind.generate} needs an agent: set agent_function_path (--set agent_function_path=NAME, "
            f"one of: {', '.join(runtime.pm.names('agent')) or 'none installed'}, or a dotted path)"
        )
    # the run's loopback server, else a chat server this run started in front of its engine (both clients')
    server = next((s for s in (runtime.server, *runtime.servers) if getattr(s, "chat", None)), None)
    if server is None:
        from .server import chat_endpoint, start_chat_server  # aiohttp: imported when an agent runs

        chat = await chat_endpoint(
            runtime.engine,
            runtime.tokenizer,
            pm=runtime.pm,
            tool_call_parser=getattr(args, "tool_call_parser", "auto"),
            template_kwargs=args.apply_chat_template_kwargs,
        )
        token = os.environ.get(SERVE_TOKEN_ENV) or run_tokens.new_token()  # no other process may drive it
        server = await start_chat_server(chat, token=token)
        runtime.servers.append(server)
    else:
        server.chat.template.template_kwargs = dict(
            args.apply_chat_template_kwargs
        )  # the run's, as in its data
    async_client, client = kind.make(
        server.url,
        run_tokens.token_for(server.url) or os.environ.get(SERVE_TOKEN_ENV),
        args.generate_timeout or 3600.0,
    )
    state = runtime.state[kind.generate] = {
        "agent": agent,
        "chat": server.chat,
        "url": server.url,
        "async_client": async_client,
        "client": client,
    }
    return state
