"""The plugins of one run, resolved once and handed down: :class:`RunPlugins`.

``rlsdk run`` (:mod:`rlsdk.run`) builds one from the run's configuration and checks every name before any
model loads (:meth:`RunPlugins.resolve_all`); the rollout step, eval, the data source, the trainer and the
agents take their plugins from it (through :attr:`rlsdk.Runtime.plugins`) instead of resolving names
again. A kind's plugin is what the run's options name for it (:meth:`rlsdk.plugins.records.PluginRecord.chosen`,
declared with the kind), resolved on first use and cached, so a function called by slime (which builds its
runtime from ``args``) pays for the kinds it uses only. Per-sample choices (``sample.custom_rm_path``,
``metadata["rm_type"]``, ``sample.generate_function_path``, a sample's tools) go through :meth:`resolve`,
cached by name.
"""

from __future__ import annotations

import copy
from argparse import Namespace
import dataclasses
from collections.abc import Callable
from typing import Any, cast

from ..answers import last_boxed
from ..errors import PluginError
from ..types import Sample
from .calls import SyncRewardRunner, call_reward
from .kinds import (
    RECORD_TYPES,
    CustomGenerate,
    Engine,
    Environment,
    GenerateRollout,
    Loss,
    Reward,
    Tool,
    Trainer,
)
from .loading import is_path
from .manager import RlsdkPluginManager
from .records import PluginRecord, RecordT, Resolved, normalize_name
from .rubric import parse_rubric, rubric_reward
from ..options import RunOptions


BOXED_PREFIX = "boxed_"
"""A reward name ``boxed_X`` that no plugin registers is reward ``X`` on the last ``\\boxed{}`` answer."""
TRAINING_KINDS = (Trainer, Loss)
"""Kinds a run resolves only when it trains."""


def sglang_url(args: RunOptions) -> str | None:
    """The URL of the running SGLang server or router ``args`` name (``sglang_url``, ``--engine URL``, or
    ``sglang_router_ip``/``_port`` without ``sglang_launch``); None: the ``sglang`` engine launches SGLang."""
    engine = str(getattr(args, "engine", None) or "")  # a kind's option, or slime's args
    url = args.sglang_url or (engine if engine.startswith(("http://", "https://")) else None)
    if not url and args.sglang_router_ip and args.sglang_router_port and not args.sglang_launch:
        url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
    return url


class RunPlugins:
    """Every plugin a run names, by kind (resolved once), and per-sample choices by name."""

    def __init__(self, args: RunOptions | Namespace, pm: RlsdkPluginManager) -> None:
        """The plugins ``args`` name (rlsdk's configuration, or slime's ``args`` for a function slime calls)
        from ``pm``."""
        self.args = args
        self.pm = pm
        self._cache: dict[tuple[str, str, bool], Resolved[Any]] = {}
        self._swapped: dict[str, Resolved[Any]] = {}
        self._chosen: dict[type[PluginRecord], Any] = {}  # the run's options never change: chosen once
        self.reward_runner: SyncRewardRunner | None = None
        """Where sync rewards run instead of a thread here (a run on Ray with ``ray_sync_rewards``)."""

    # ----- resolution ---------------------------------------------------------------------------

    def resolve(self, kind: str, spec: str, *, group: bool = False) -> Resolved[Any]:
        """``kind``'s plugin named (or pathed) ``spec``, resolved once per run; ``group`` marks a dotted-path
        reward as a group reward (slime's ``--group-rm``)."""
        key = (kind, spec.strip(), group)
        if key not in self._cache:
            if kind == "reward":
                self._cache[key] = self._resolve_reward(key[1], group)
            else:
                self._cache[key] = self.pm.resolve(kind, key[1], **({"group": True} if group else {}))
        return self._cache[key]

    def get(self, record: type[RecordT]) -> Resolved[RecordT] | None:
        """The run's plugin of ``record``'s kind (what its options name), or None where they name none."""
        if record.kind in self._swapped:
            return self._swapped[record.kind]
        if record not in self._chosen:
            if record is Reward:
                self._chosen[record] = self.reward
            else:
                spec = record.chosen(self.args)
                self._chosen[record] = self.resolve(record.kind, spec) if spec else None
        return cast("Resolved[RecordT] | None", self._chosen[record])

    def one(self, record: type[RecordT]) -> Resolved[RecordT]:
        """:meth:`get` for a kind the run always has (a default of its own)."""
        resolved = self.get(record)
        if resolved is None:
            raise PluginError(f"the run names no {record.kind} ({record.options[0].name} is not set)")
        return resolved

    def each(self, record: type[RecordT]) -> list[Resolved[RecordT]]:
        """Every plugin a :attr:`~rlsdk.plugins.records.PluginRecord.many` kind's option names, in order: a
        list of names or paths, or one string of them joined by commas (``jsonl,tensorboard``)."""
        if record not in self._chosen:
            specs = record.chosen(self.args)
            names = [specs] if isinstance(specs, str) else list(specs or [])
            parts = [part.strip() for name in names for part in name.split(",")]
            self._chosen[record] = [self.resolve(record.kind, part) for part in parts if part]
        return cast("list[Resolved[RecordT]]", self._chosen[record])

    def swap(self, record: type[PluginRecord], factory: Callable[..., Any]) -> None:
        """Build ``record``'s kind (the engine or the trainer) with ``factory`` instead of its plugin's own,
        keeping the plugin's name and provenance for errors (the Ray wiring's actors)."""
        resolved = self.get(record)
        assert resolved is not None, record.kind
        self._swapped[record.kind] = Resolved(
            dataclasses.replace(resolved.record, func=factory),
            resolved.info,
            is_async=False,
            accepts_evaluation=False,
        )

    def resolve_all(self) -> None:
        """Resolve every plugin the run names, so a wrong name fails before any model loads; the engine's and
        a trainer's ``check(args)`` refuse settings they cannot take before the engines start. The environment
        was taken when the configuration was built."""
        for record in RECORD_TYPES.values():
            if not record.options or record is Environment or record in TRAINING_KINDS:
                continue
            if record.many:
                self.each(record)
            else:
                self.get(record)
        self.eval_rollout  # noqa: B018 (resolved to fail early)
        engine = self.one(Engine)
        if engine.record.check is not None:
            engine.record.check(self.args)
        if getattr(self.args, "train", False):
            trainer = self.one(Trainer)
            self.get(Loss)  # resolved to fail early; the trainer builds its own from args
            if trainer.record.check is not None:
                trainer.record.check(self.args)

    # ----- kinds with more than one option ---------------------------------------------------------

    @property
    def eval_rollout(self) -> Resolved[GenerateRollout]:
        """generate_rollout for eval (``eval_function_path``, else the training one)."""
        spec = getattr(self.args, "eval_function_path", None)
        if spec and GenerateRollout.kind not in self._swapped:
            return self.resolve(GenerateRollout.kind, spec)
        return self.one(GenerateRollout)

    def generator_for(self, sample: Sample) -> Resolved[CustomGenerate]:
        """The sample's own ``generate_function_path`` (slime's per-sample override) or the run's."""
        spec = sample.generate_function_path
        return self.resolve(CustomGenerate.kind, spec) if spec else self.one(CustomGenerate)

    @property
    def reward(self) -> Resolved[Reward]:
        """The run's reward: ``custom_rm_path`` (a group reward with ``group_rm``), else ``rm_type``."""
        group = bool(getattr(self.args, "custom_rm_path", None) and getattr(self.args, "group_rm", False))
        return self.resolve(Reward.kind, Reward.chosen(self.args), group=group)

    @property
    def engine(self) -> Resolved[Engine]:
        return self.one(Engine)

    def tools(self, names: list[str]) -> dict[str, Tool]:
        """The tools ``names`` name, by their registered name."""
        return {tool.name: tool for tool in (self.resolve("tool", name).record for name in names)}

    def task_generator(self, name: str) -> Resolved[Any]:
        """A task generator by registered name only: buffer requests name it, and a path would run code."""
        key = ("task_generator", name.strip(), False)
        if key not in self._cache:
            self._cache[key] = self.pm.resolve("task_generator", name, registered_only=True)
        return self._cache[key]

    # ----- rewards ---------------------------------------------------------------------------------

    def _resolve_reward(self, spec: str, group: bool) -> Resolved[Any]:
        options = {"group": True} if group else {}
        parts = parse_rubric(spec)
        if parts is not None:  # a rubric: a weighted sum of rewards
            return rubric_reward(spec, [(part, self.resolve("reward", part.spec)) for part in parts])
        name = normalize_name(spec)
        if is_path(spec) or not name.startswith(BOXED_PREFIX) or name in self.pm.records("reward"):
            return self.pm.resolve("reward", spec, **options)
        inner = self.pm.resolve("reward", spec[len(BOXED_PREFIX) :], **options)
        record = Reward(
            name=name,
            func=_boxed(inner),
            description=f"{inner.name} on the last \\boxed{{}} answer",
            group=inner.record.group,
        )
        return Resolved(record, inner.info, is_async=True, accepts_evaluation=True)


def _boxed_sample(sample: Sample) -> Sample:
    boxed = copy.copy(sample)
    boxed.response = last_boxed(sample.response or "") or ""
    return boxed


def _boxed(inner: Resolved[Any]) -> Any:
    async def boxed_reward(args: RunOptions, sample: Any, evaluation: bool = False) -> Any:
        target = [_boxed_sample(s) for s in sample] if inner.record.group else _boxed_sample(sample)
        return await call_reward(inner, args, target, evaluation=evaluation)

    return boxed_reward
