"""A session as a tree of token segments: every answered (turn, choice) is a path from a root, and paths
share their segments as far as their tokens (and loss masks) agree. A client that rewrites its history
(drops old reasoning, edits a message, asks again) adds a branch; nothing it sampled is lost.

The export (``tree`` in a session's record and in ``sample.metadata["agent"]``; see docs/agents.md)::

    {"format": "rlsdk.trajectory_tree/1",
     "nodes": [{"id": 0, "parent": null, "tokens": [...], "loss_mask": [...], "logprobs": [...],
                "ends": [[turn, choice], ...]}, ...],
     "trained": [0, 3, 4],            # node ids from a root to the trained leaf
     "trained_turns": [[0, 0], [2, 0]],
     "branches": 2}                   # leaves

Nodes come parents first; a path's tokens are its nodes' tokens joined, ``loss_mask`` 1 for sampled tokens
(their ``logprobs`` the rollout's, 0.0 elsewhere), and ``ends`` names the (turn, choice) whose path ends
with the node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .sessions import Session

FORMAT = "rlsdk.trajectory_tree/1"


@dataclass(eq=False)
class _Node:
    tokens: list[int]
    mask: list[int]
    logprobs: list[float]
    children: list[_Node] = field(default_factory=list)
    ends: list[tuple[int, int]] = field(default_factory=list)

    def split(self, at: int) -> _Node:
        """Keep the first ``at`` tokens here and move the rest (with the children and ends) below."""
        rest = _Node(self.tokens[at:], self.mask[at:], self.logprobs[at:], self.children, self.ends)
        self.tokens, self.mask, self.logprobs = self.tokens[:at], self.mask[:at], self.logprobs[:at]
        self.children, self.ends = [rest], []
        return rest


def _insert(node: _Node, tokens: list[int], mask: list[int], logprobs: list[float]) -> _Node:
    """Add the segment below ``node``, sharing what a child already has; the node it ends at."""
    position = 0
    while position < len(tokens):
        key = (tokens[position], mask[position])
        child = next((c for c in node.children if (c.tokens[0], c.mask[0]) == key), None)
        if child is None:
            child = _Node(tokens[position:], mask[position:], logprobs[position:])
            node.children.append(child)
            return child
        k = 0
        while (
            k < len(child.tokens)
            and position + k < len(tokens)
            and (child.tokens[k], child.mask[k]) == (tokens[position + k], mask[position + k])
        ):
            k += 1
        if k < len(child.tokens):
            child.split(k)
        node, position = child, position + k
    return node


def session_tree(session: Session) -> dict[str, Any] | None:
    """The session's tree of token segments in the export format, or None before any answer."""
    root = _Node([], [], [])
    ends: dict[tuple[int, int], _Node] = {}
    for turn in session.answered():
        for c, choice in enumerate(turn.choices):
            if turn.parent is None:
                start, between = root, turn.prompt_ids
            else:
                start, between = ends[turn.parent], turn.prompt_ids[turn.reused :]
            tokens = between + choice.output_ids
            mask = [0] * len(between) + [1] * len(choice.output_ids)
            end = _insert(start, tokens, mask, [0.0] * len(between) + choice.logprobs)
            end.ends.append((turn.index, c))
            ends[(turn.index, c)] = end
    trajectory = session.trajectory()
    if trajectory is None:
        return None
    nodes: list[dict[str, Any]] = []
    ids: dict[int, int] = {}
    stack: list[tuple[_Node, int | None]] = [(child, None) for child in reversed(root.children)]
    while stack:
        node, parent = stack.pop()
        ids[id(node)] = len(nodes)
        nodes.append(
            {
                "id": len(nodes),
                "parent": parent,
                "tokens": node.tokens,
                "loss_mask": node.mask,
                "logprobs": node.logprobs,
                "ends": [list(e) for e in node.ends],
            }
        )
        stack += [(child, ids[id(node)]) for child in reversed(node.children)]
    trained = [ids[id(ends[trajectory.turns[-1]])]]
    while (parent := nodes[trained[-1]]["parent"]) is not None:
        trained.append(parent)
    return {
        "format": FORMAT,
        "nodes": nodes,
        "trained": trained[::-1],
        "trained_turns": [list(t) for t in trajectory.turns],
        "branches": len(nodes) - len({n["parent"] for n in nodes if n["parent"] is not None}),
    }


def tree_paths(tree: dict[str, Any]) -> dict[tuple[int, int], dict[str, list[Any]]]:
    """Each (turn, choice) of an exported tree with its path's ``tokens``, ``loss_mask`` and ``logprobs``
    (how a reader walks the format)."""
    nodes = tree["nodes"]
    paths: dict[tuple[int, int], dict[str, list[Any]]] = {}
    for node in nodes:
        for turn, choice in node["ends"]:
            chain = [node]
            while chain[-1]["parent"] is not None:
                chain.append(nodes[chain[-1]["parent"]])
            chain.reverse()
            paths[(turn, choice)] = {
                key: [x for n in chain for x in n[key]] for key in ("tokens", "loss_mask", "logprobs")
            }
    return paths
