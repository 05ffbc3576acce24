"""The ``openai_agent`` custom_generate: runs an agent written with the ``openai`` client against the run's
engine, one session per sample, and turns the session's record into the training sample.

The agent (``args.agent_function_path``: an agent plugin or a dotted path) is called as
``agent(args, sample, client)`` with an ``openai.AsyncOpenAI`` (async agents) or ``openai.OpenAI`` (sync
agents, in a worker thread) whose base URL is the sample's session. Its result and final transcript land in
``sample.metadata["agent"]`` with the session's turns and forks, for rewards and the fork-rate metric.
"""

from __future__ import annotations

import os
from typing import Any

from ..aio.blocking import blocking_pool
from ..engines.protocol import SERVE_TOKEN_ENV
from ..errors import PluginCallError, PluginError
from ..plugins.records import Resolved
from ..runtime import Runtime, get_runtime
from ..types import Sample
from .server import chat_endpoint, start_chat_server
from .sessions import Session

_STATE = "openai_agent"


async def openai_agent(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Run the run's agent for ``sample`` through an OpenAI client bound to a new session; the sample
    gets the session's token-exact trajectory (model tokens loss mask 1, the rest 0)."""
    runtime = get_runtime(args)
    state = await _state(args, runtime)
    agent: Resolved = state["agent"]
    where = f"{agent.describe()} on sample {sample.group_index}/{sample.index}"
    session = state["chat"].sessions.open(
        sampling=sampling_params,
        max_response_tokens=sampling_params.get("max_new_tokens"),
        max_context_tokens=getattr(args, "rollout_max_context_len", None),
        label=where,
    )
    try:
        result = await _run_agent(state, agent, args, sample, f"{state['url']}/sessions/{session.id}/v1")
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
    latest turn, and ``metadata["agent"]``."""
    trajectory = session.trajectory()
    if trajectory is None:
        raise PluginCallError(f"{where} made no chat completion request through its client")
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
    sample.metadata["agent"] = {
        "name": agent.name,
        "result": result,
        "messages": last_turn.path_messages(trajectory.turns[-1][1]),
        "turns": len(session.turns),
        "trajectory_turns": len(trajectory.turns),
        "forks": session.forks(),
        "reused_tokens": sum(turn.reused for turn in session.turns),
    }
    return sample


async def _run_agent(state: dict[str, Any], agent: Resolved, args: Any, sample: Sample, base_url: str) -> Any:
    if agent.is_async:
        return await agent.func(args, sample, state["async_client"].with_options(base_url=base_url))
    return await blocking_pool().run(
        agent.func, args, sample, state["client"].with_options(base_url=base_url)
    )


async def _state(args: Any, runtime: Runtime) -> dict[str, Any]:
    """The run's agent, chat endpoint and clients, made on first use: the run's loopback server's
    endpoint, or (an engine with its own URL, such as SGLang) a chat server in front of the engine."""
    state = runtime.state.get(_STATE)
    if state is not None:
        return state
    try:
        import openai
    except ImportError:
        raise PluginError("openai_agent needs the openai package: pip install 'rlsdk[agents]'") from None
    if not args.agent_function_path:
        raise PluginError(
            "openai_agent needs an agent: set agent_function_path (--set agent_function_path=NAME, "
            f"one of: {', '.join(runtime.pm.names('agent')) or 'none installed'}, or a dotted path)"
        )
    agent = runtime.plugins.agent
    server = runtime.server
    if server is None or server.chat is None:
        chat = await chat_endpoint(
            runtime.engine,
            runtime.tokenizer,
            pm=runtime.pm,
            tool_call_parser=args.tool_call_parser,
            template_kwargs=args.apply_chat_template_kwargs,
        )
        server = await start_chat_server(chat)
        runtime.servers.append(server)
    else:
        server.chat.template.template_kwargs = dict(
            args.apply_chat_template_kwargs
        )  # the run's, as in its data
    options: dict[str, Any] = {
        "api_key": os.environ.get(SERVE_TOKEN_ENV) or "rlsdk",
        "max_retries": 0,
        "timeout": args.generate_timeout or 3600.0,
    }
    state = runtime.state[_STATE] = {
        "agent": agent,
        "chat": server.chat,
        "url": server.url,
        "async_client": openai.AsyncOpenAI(base_url=server.url, **options),
        "client": openai.OpenAI(base_url=server.url, **options),
    }
    return state
