"""Sessions: the token-exact record of one agent's conversation with the model.

Every chat request of a session is a turn. A turn whose messages extend a recorded turn (its request's
messages, then the assistant message it returned) reuses that turn's prompt ids and sampled ids as they
are, and tokenises only the messages after it; the key is the message tree and the sampled ids, never
re-tokenised text. A request that continues a turn another request already continued, or that extends no
recorded turn at all (the agent edited or dropped history), starts a fork, which is recorded with where it
diverged. The trajectory handed to training is the path to the latest turn: prompt ids, then per turn the
ids between turns (loss mask 0) and the sampled ids (loss mask 1, with their log-probs).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Choice:
    """One sampled answer of a turn: the assistant message returned and the ids behind it."""

    message: dict[str, Any]
    """The canonical assistant message (see :func:`~rlsdk.agents.chat_template.canonical_message`)."""
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    weight_version: str
    malformed_calls: int = 0
    """Tool calls in the turn whose arguments are no JSON object (kept as the model wrote them)."""


@dataclass
class Turn:
    """One chat request of a session and what the model answered."""

    index: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    prompt_ids: list[int]
    parent: tuple[int, int] | None
    """(turn, choice) whose recorded ids begin this turn's prompt; None for a root."""
    reused: int
    """Prompt ids taken exactly from the parent's record."""
    fork: dict[str, Any] | None = None
    """Why this turn branched the tree (``reason``, ``diverged_at`` message index), or None."""
    choices: list[Choice] = field(default_factory=list)
    error: str | None = None
    """Why the turn has no answer (the engine refused or aborted it): it is then no sibling of a retry."""

    def path_messages(self, choice: int) -> list[dict[str, Any]]:
        return [*self.messages, self.choices[choice].message]


@dataclass
class Trajectory:
    """A training sample's tokens: ``prompt_length`` prompt ids, then the response with its loss mask and
    rollout log-probs aligned; ``turns`` lists the path's (turn, choice)."""

    tokens: list[int]
    prompt_length: int
    loss_mask: list[int]
    rollout_log_probs: list[float]
    turns: list[tuple[int, int]]
    finish_reason: str
    weight_versions: list[str]


@dataclass
class Plan:
    """Where a new request attaches to the tree: its parent and the messages after it."""

    parent: tuple[int, int] | None
    new_messages: list[dict[str, Any]]
    fork: dict[str, Any] | None


class Session:
    """The record of one sample's conversation. ``sampling`` (the run's sampling parameters) overrides
    the request's; ``max_response_tokens`` bounds the response (model and tool tokens) across turns."""

    def __init__(
        self,
        session_id: str,
        *,
        sampling: dict[str, Any] | None = None,
        max_response_tokens: int | None = None,
        max_context_tokens: int | None = None,
        label: str = "",
    ) -> None:
        self.id = session_id
        self.label = label
        self.sampling = dict(sampling or {})
        self.max_response_tokens = max_response_tokens
        self.max_context_tokens = max_context_tokens
        self.turns: list[Turn] = []
        self.aborted = False
        self.created = time.time()

    # ------------------------------------------------------------------------------- the tree

    def plan(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Plan:
        """Attach ``messages`` to the longest recorded path they extend; say whether that forks."""
        best: tuple[int, int] | None = None
        best_length = 0
        candidates = sorted(
            ((len(t.messages) + 1, t.index, c) for t in self.turns for c in range(len(t.choices))),
            key=lambda candidate: -candidate[0],
        )  # longest first: the first that the request extends is the attachment point
        for length, index, c in candidates:
            turn = self.turns[index]
            if length <= len(messages) and turn.tools == tools and messages[:length] == turn.path_messages(c):
                best, best_length = (index, c), length
                break
        siblings = [t for t in self.turns if t.parent == best and t.error is None]
        fork = None
        if siblings:
            closest = max(siblings, key=lambda t: _common_prefix(t.messages, messages))
            same = closest.messages == messages and closest.tools == tools
            fork = {
                "reason": "resampled" if same else "edited" if best is not None else "new_root",
                "diverged_at": _common_prefix(closest.messages, messages),
                "sibling": closest.index,
            }
        return Plan(best, messages[best_length:], fork)

    def record_turn(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        prompt_ids: list[int],
        plan: Plan,
    ) -> Turn:
        reused = 0
        if plan.parent is not None:
            parent = self.turns[plan.parent[0]]
            reused = len(parent.prompt_ids) + len(parent.choices[plan.parent[1]].output_ids)
        turn = Turn(len(self.turns), messages, tools, prompt_ids, plan.parent, reused, plan.fork)
        self.turns.append(turn)
        return turn

    def recorded_ids(self, parent: tuple[int, int]) -> tuple[list[dict[str, Any]], list[int], list[int]]:
        """A recorded (turn, choice): its request messages, its prompt ids plus sampled ids, and the sampled ids."""
        turn = self.turns[parent[0]]
        output = turn.choices[parent[1]].output_ids
        return turn.messages, turn.prompt_ids + output, output

    def response_tokens(self, prompt_ids: list[int], parent: tuple[int, int] | None) -> int:
        """Response tokens (model and tool) a turn with ``prompt_ids`` under ``parent`` starts with."""
        if parent is None:
            return 0
        index = parent[0]
        while (up := self.turns[index].parent) is not None:
            index = up[0]
        return len(prompt_ids) - len(self.turns[index].prompt_ids)

    # ------------------------------------------------------------------------------- results

    def answered(self) -> list[Turn]:
        return [t for t in self.turns if t.choices]

    def forks(self) -> list[dict[str, Any]]:
        return [{"turn": t.index, **t.fork} for t in self.turns if t.fork is not None]

    def trajectory(self) -> Trajectory | None:
        """The path to the latest answered turn (its first choice), or None before any answer."""
        answered = self.answered()
        return self.path((answered[-1].index, 0)) if answered else None

    def path(self, leaf: tuple[int, int]) -> Trajectory:
        """The tokens from the root to the answered (turn, choice) ``leaf``: each turn's ids between turns
        (loss mask 0) and its sampled ids (loss mask 1, with their log-probs)."""
        path = [leaf]
        while (parent := self.turns[path[-1][0]].parent) is not None:
            path.append(parent)
        path.reverse()
        root = self.turns[path[0][0]]
        tokens = list(root.prompt_ids)
        mask: list[int] = []
        logprobs: list[float] = []
        versions = []
        for index, c in path:
            turn, choice = self.turns[index], self.turns[index].choices[c]
            if turn.prompt_ids[: len(tokens)] != tokens:
                raise AssertionError(
                    f"session {self.id}: turn {index}'s prompt does not extend the recorded ids"
                )
            between = turn.prompt_ids[len(tokens) :]
            tokens += between + choice.output_ids
            mask += [0] * len(between) + [1] * len(choice.output_ids)
            logprobs += [0.0] * len(between) + choice.logprobs
            versions.append(choice.weight_version)
        last = self.turns[leaf[0]].choices[leaf[1]]
        return Trajectory(tokens, len(root.prompt_ids), mask, logprobs, path, last.finish_reason, versions)


def _common_prefix(a: list[Any], b: list[Any]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


class SessionStore:
    """The open sessions of one endpoint, at most ``max_sessions`` at once."""

    def __init__(self, max_sessions: int = 10_000) -> None:
        self.max_sessions = max_sessions
        self._sessions: dict[str, Session] = {}

    def open(self, **options: Any) -> Session:
        if len(self._sessions) >= self.max_sessions:
            raise OverflowError(
                f"{len(self._sessions)} sessions are open, the most allowed: close finished ones"
            )
        session = Session(secrets.token_hex(16), **options)
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def close(self, session_id: str) -> Session | None:
        return self._sessions.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._sessions)


def agent_metrics(samples: list[Any]) -> dict[str, Any]:
    """A step's agent metrics from its samples' ``metadata["agent"]``: turns, forks, the fork rate (forks
    per turn that had history to continue), its mean per session, branches (leaves of the sessions' trees)
    and tool calls whose arguments were no JSON object; empty when no sample ran an agent."""
    records = [s.metadata["agent"] for s in samples if isinstance(s.metadata.get("agent"), dict)]
    if not records:
        return {}
    turns = sum(r["turns"] for r in records)
    forks = sum(len(r["forks"]) for r in records)
    continued = sum(max(r["turns"] - 1, 0) for r in records)
    per_session = [len(r["forks"]) / (r["turns"] - 1) if r["turns"] > 1 else 0.0 for r in records]
    return {
        "agent/sessions": len(records),
        "agent/turns": turns,
        "agent/forks": forks,
        "agent/fork_rate": forks / continued if continued else 0.0,
        "agent/fork_rate_per_session": sum(per_session) / len(records),
        "agent/branches": sum(r.get("branches", 1) for r in records),
        "agent/malformed_tool_calls": sum(r.get("malformed_tool_calls", 0) for r in records),
    }
