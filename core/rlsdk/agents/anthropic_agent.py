"""The ``anthropic_agent`` custom_generate: ``openai_agent``'s session runner with an agent written with the
``anthropic`` client. The agent is called as ``agent(args, sample, client)`` with an
``anthropic.AsyncAnthropic`` (async agents) or ``anthropic.Anthropic`` (sync agents, in a worker thread)
whose base URL is the sample's session, so its ``client.messages.create(...)`` calls reach ``/v1/messages``
and are recorded token for token."""

from __future__ import annotations

from typing import Any

from ..types import Sample
from .openai_agent import AgentClient, run_session_agent
from ..config import RolloutConfig


def _anthropic_clients(base_url: str, token: str | None, timeout: float) -> tuple[Any, Any]:
    import anthropic

    # a run's server takes its token as a bearer token (auth_token); without one any api key is fine
    options: dict[str, Any] = {"max_retries": 0, "timeout": timeout}
    options.update({"auth_token": token} if token else {"api_key": "rlsdk"})
    return anthropic.AsyncAnthropic(base_url=base_url, **options), anthropic.Anthropic(
        base_url=base_url, **options
    )


ANTHROPIC = AgentClient("anthropic_agent", "anthropic", _anthropic_clients, "")


async def anthropic_agent(args: RolloutConfig, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Run the run's agent for ``sample`` through an Anthropic client bound to a new session; the sample
    gets the session's token-exact trajectory (model tokens loss mask 1, the rest 0)."""
    return await run_session_agent(ANTHROPIC, args, sample, sampling_params)
