"""Rollout data types, with slime's field names and meanings so slime plugins run unchanged."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .sample_stats import PrefixCacheInfo, SpecInfo
from .options import RunOptions


RewardValue = float | dict[str, Any] | None
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

        @classmethod
        def _missing_(cls, value: object) -> Sample.Status | None:
            """``Sample.Status(slime_status)``: another enum's member with one of these values."""
            inner = getattr(value, "value", None)
            return cls(inner) if isinstance(inner, str) and inner in cls._value2member_map_ else None

    group_index: int | None = None
    index: int | None = None
    prompt: str | Messages = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: RewardValue = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    session_id: str | None = None
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    remove_sample: bool = False
    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)
    spec_info: SpecInfo = field(default_factory=SpecInfo)
    # slime's other fields, so slime's functions and data read and write them unchanged
    rollout_id: int | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    rollout_top_p_token_ids: Any = None
    rollout_top_p_token_offsets: Any = None
    rollout_routed_experts: Any = None
    teacher_log_probs: list[float] | None = None
    train_metadata: dict[str, Any] | None = None
    non_generation_time: float = 0.0

    SpecInfo = SpecInfo
    PrefixCacheInfo = PrefixCacheInfo

    def get_reward_value(self, args: RunOptions) -> float | None:
        """The scalar reward: ``reward[args.reward_key]`` for dict rewards, else the reward itself."""
        return reward_value(self.reward, getattr(args, "reward_key", None))

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def effective_response_length(self) -> int:
        """Response tokens that train: the loss mask's sum (all of them without a mask)."""
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    def append_response_tokens(
        self,
        tokens: Iterable[int] | Any = None,
        /,
        log_probs: Iterable[float] | None = None,
        trainable: bool = True,
        **slime_form: Any,
    ) -> None:
        """Append response tokens keeping ``tokens``, ``loss_mask`` and ``rollout_log_probs`` aligned.

        Model tokens (``trainable=True``) need their engine log-probs and get loss mask 1; tool or
        environment tokens get loss mask 0 and log-prob placeholders of 0.0.

        slime's form is accepted too: ``append_response_tokens(args, tokens=..., log_probs=...,
        trainable=..., meta_info=..., text=..., update_terminal_info=True)``; ``text`` is appended to
        ``response`` and ``meta_info`` (SGLang's) updates the engine statistics, weight versions and status.
        """
        args: Any
        if "tokens" in slime_form:
            args, tokens = tokens, slime_form.pop("tokens")
            log_probs = slime_form.pop("log_probs", log_probs)
            trainable = slime_form.pop("trainable", trainable)
        else:
            args = slime_form.pop("args", None)
        text, meta_info = slime_form.pop("text", None), slime_form.pop("meta_info", None)
        update_terminal_info = slime_form.pop("update_terminal_info", True)
        if slime_form:
            raise TypeError(f"append_response_tokens got unexpected arguments {sorted(slime_form)}")
        tokens = list(tokens or ())
        if log_probs is None:
            if trainable and tokens:
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
        if text is not None:
            self.response += text
        if meta_info is not None and update_terminal_info:
            self.apply_finish_info(meta_info, args)

    def apply_finish_info(self, meta_info: dict[str, Any], args: RunOptions | None = None) -> None:
        """What SGLang's final ``meta_info`` says about the sample, as slime records it: prefix cache hits
        (speculative decoding too with ``args.sglang_speculative_algorithm``), the weight version, and the
        status from ``finish_reason`` (length: truncated, abort: aborted, stop: completed)."""
        if "finish_reason" not in meta_info:
            return
        if getattr(args, "sglang_speculative_algorithm", None):
            self.spec_info.add(meta_info)
        self.prefix_cache_info.add(meta_info)
        if "weight_version" in meta_info:
            self.weight_versions.append(meta_info["weight_version"])
        finish = (meta_info["finish_reason"] or {}).get("type")
        status = {"length": "truncated", "abort": "aborted", "stop": "completed"}.get(str(finish))
        if status is not None:
            self.status = Sample.Status(status)

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
        """A JSON-ready dict with slime's field names (and any attribute set beyond them, as slime's)."""
        data = dict(vars(self))
        data["status"] = self.status.value
        data["spec_info"] = self.spec_info.to_dict()
        data["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        """The sample of :meth:`to_dict` or of slime's; keys that are no field become attributes."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if "status" in values:
            values["status"] = cls.Status(values["status"])
        for name, kind in (("spec_info", SpecInfo), ("prefix_cache_info", PrefixCacheInfo)):
            if name in values and not isinstance(values[name], kind):
                values[name] = kind.from_dict(values[name])
        sample = cls(**values)
        for key, value in data.items():
            if key not in known:
                setattr(sample, key, value)
        return sample


def policy_version(label: str) -> int | None:
    """A ``weight_versions`` entry as a number: ``default`` (the starting weights) is 0; a label the run
    did not set is None."""
    return 0 if label == "default" else int(label) if label.isdigit() else None


def policy_versions(sample: Sample) -> set[int]:
    """The policy versions that sampled ``sample``'s tokens (more than one for a sample continued after a
    weight sync; labels the run did not set left out)."""
    return {v for v in map(policy_version, sample.weight_versions) if v is not None}


def reward_value(reward: RewardValue, reward_key: str | None) -> float | None:
    """Select ``reward_key`` from a dict reward; a missing key is an error naming the keys present."""
    if isinstance(reward, dict):
        if reward_key is None:
            raise KeyError(f"the reward is a dict with keys {sorted(reward)}: choose one with --reward-key")
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
