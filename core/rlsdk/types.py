"""Rollout data types, with slime's field names and meanings so slime plugins run unchanged."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

Reward = float | dict[str, Any] | None
Messages = list[dict[str, Any]]


@dataclass
class Sample:
    """One prompt and one response: the unit every plugin reads and writes.

    ``tokens`` holds prompt plus response ids; ``loss_mask`` and ``rollout_log_probs`` cover the
    response only (``response_length`` entries each; a ``None`` loss mask means all ones).
    """

    class Status(str, enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    prompt: str | Messages = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: Reward = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    session_id: str | None = None
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    remove_sample: bool = False
    prefix_cache_info: dict[str, Any] = field(default_factory=dict)
    spec_info: dict[str, Any] = field(default_factory=dict)

    def get_reward_value(self, args: Any) -> float | None:
        """The scalar reward: ``reward[args.reward_key]`` for dict rewards, else the reward itself."""
        return reward_value(self.reward, getattr(args, "reward_key", None))

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    def append_response_tokens(
        self, tokens: Iterable[int], log_probs: Iterable[float] | None = None, trainable: bool = True
    ) -> None:
        """Append response tokens keeping ``tokens``, ``loss_mask`` and ``rollout_log_probs`` aligned.

        Model tokens (``trainable=True``) need their engine log-probs and get loss mask 1; tool or
        environment tokens get loss mask 0 and log-prob placeholders of 0.0.
        """
        tokens = list(tokens)
        if log_probs is None:
            if trainable:
                raise ValueError("trainable tokens need their log-probs from the engine")
            log_probs = [0.0] * len(tokens)
        log_probs = list(map(float, log_probs))
        if len(log_probs) != len(tokens):
            raise ValueError(f"{len(tokens)} tokens but {len(log_probs)} log-probs")
        self._check_alignment()
        n = self.response_length
        if self.loss_mask is None:
            self.loss_mask = [1] * n
        if self.rollout_log_probs is None:
            self.rollout_log_probs = [0.0] * n
        self.tokens += tokens
        self.loss_mask += [1 if trainable else 0] * len(tokens)
        self.rollout_log_probs += log_probs
        self.response_length = n + len(tokens)

    def _check_alignment(self) -> None:
        n = self.response_length
        for name, value in (("loss_mask", self.loss_mask), ("rollout_log_probs", self.rollout_log_probs)):
            if value is not None and len(value) != n:
                raise ValueError(
                    f"sample {self.group_index}/{self.index}: {name} has {len(value)} entries "
                    f"but response_length is {n}"
                )
        if n > len(self.tokens):
            raise ValueError(
                f"sample {self.group_index}/{self.index}: response_length {n} "
                f"exceeds {len(self.tokens)} tokens"
            )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with slime's field names."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["status"] = self.status.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown Sample fields: {sorted(unknown)}")
        values = dict(data)
        if "status" in values:
            values["status"] = cls.Status(values["status"])
        return cls(**values)


def reward_value(reward: Reward, reward_key: str | None) -> float | None:
    """Select ``reward_key`` from a dict reward; a missing key is an error naming the keys present."""
    if isinstance(reward, dict):
        if reward_key is None:
            raise KeyError(
                f"the reward is a dict with keys {sorted(reward)}: choose one with --reward-key"
            )
        if reward_key not in reward:
            raise KeyError(f"reward key {reward_key!r} not in the reward's keys {sorted(reward)}")
        value = reward[reward_key]
        return None if value is None else float(value)
    return None if reward is None else float(reward)


@dataclass
class RolloutFnTrainOutput:
    """What a training ``generate_rollout`` returns: kept groups and the step's metrics."""

    samples: list[list[Sample]]
    metrics: dict[str, Any] = field(default_factory=dict)
    discarded: list[list[Sample]] = field(default_factory=list)
    """Groups dropped by a filter or failed, each sample's ``metadata`` saying why (rlsdk only)."""


@dataclass
class RolloutFnEvalOutput:
    """What an eval ``generate_rollout`` returns: ``{dataset: {"rewards", "truncated", "samples"}}``."""

    data: dict[str, dict[str, Any]]
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class DynamicFilterOutput:
    """A dynamic filter's verdict on one group; ``reason`` names the drop in the metrics."""

    keep: bool
    reason: str | None = None
    keep_when_insufficient: bool = False
