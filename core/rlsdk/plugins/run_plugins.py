"""The plugins of one run, resolved once and handed down: :class:`RunPlugins`.

``rlsdk run`` (:mod:`rlsdk.run`) builds one from the run's configuration and checks every name before any
model loads (:meth:`RunPlugins.resolve_all`); the rollout step, eval, the data source, the trainer and the
agents take their plugins from it (through :attr:`rlsdk.Runtime.plugins`) instead of resolving names
again. Each kind is resolved on first use and cached, so a function called by slime (which builds its
runtime from ``args``) pays for the kinds it uses only. Per-sample choices (``sample.custom_rm_path``,
``metadata["rm_type"]``, ``sample.generate_function_path``, a sample's tools) go through :meth:`resolve`,
cached by name.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

from ..answers import last_boxed
from ..training_options import loss_spec
from ..types import Sample
from .calls import SyncRewardRunner, call_reward
from .loading import is_path
from .manager import RlsdkPluginManager
from .records import Resolved, Reward, Tool, normalize_name
from .rubric import parse_rubric, rubric_reward

DEFAULT_GENERATE = "single_turn"
MEGATRON_HOOKS = ("megatron_init", "megatron_before_log_prob", "megatron_before_train_step", "model_provider")
"""The megatron trainer's kinds (slime's ``--custom-megatron-*`` and ``--custom-model-provider-path``)."""
BOXED_PREFIX = "boxed_"
"""A reward name ``boxed_X`` that no plugin registers is reward ``X`` on the last ``\\boxed{}`` answer."""


def engine_name(args: Any) -> str:
    """``--engine URL`` names the ``sglang`` engine, which reads the URL from ``args.engine``."""
    return "sglang" if args.engine.startswith(("http://", "https://")) else args.engine


def sglang_url(args: Any) -> str | None:
    """The URL of the running SGLang server or router ``args`` name (``sglang_url``, ``--engine URL``, or
    ``sglang_router_ip``/``_port`` without ``sglang_launch``); None: the ``sglang`` engine launches SGLang."""
    url = args.sglang_url or (args.engine if args.engine.startswith(("http://", "https://")) else None)
    if not url and args.sglang_router_ip and args.sglang_router_port and not args.sglang_launch:
        url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
    return url


class RunPlugins:
    """Every plugin a run names, by kind (an attribute each, resolved once), and per-sample choices by name."""

    def __init__(self, args: Any, pm: RlsdkPluginManager) -> None:
        self.args = args
        self.pm = pm
        self._cache: dict[tuple[str, str, bool], Resolved[Any]] = {}
        self._swapped: dict[str, Resolved[Any]] = {}
        self._lists: dict[tuple[str, str], list[Resolved[Any]]] = {}
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

    def _named(self, kind: str, spec: str | None) -> Resolved[Any] | None:
        if kind in self._swapped:
            return self._swapped[kind]
        return self.resolve(kind, spec) if spec else None

    def swap(self, kind: str, factory: Callable[..., Any]) -> None:
        """Build ``kind`` (the engine or the trainer) with ``factory`` instead of its plugin's own, keeping the
        plugin's name and provenance for errors (the Ray wiring's actors)."""
        resolved = getattr(self, kind)
        assert resolved is not None, kind
        self._swapped[kind] = Resolved(
            dataclasses.replace(resolved.record, func=factory),
            resolved.info,
            is_async=False,
            accepts_evaluation=False,
        )

    def resolve_all(self) -> None:
        """Resolve every plugin the run names, so a wrong name fails before any model loads; the engine's and
        the trainer's ``check(args)`` refuse settings they cannot take before the engines start."""
        args = self.args
        for kind in ("generate_rollout", "eval_rollout", "engine", "custom_generate", "reward"):
            getattr(self, kind)
        if self.engine.record.check is not None:
            self.engine.record.check(args)
        for kind in ("dynamic_filter", "over_sampling_filter", "buffer_filter", "agent", "tool_call_parser"):
            getattr(self, kind)
        for kind in (
            "sample_hooks",
            "data_source",
            "rollout_logs",
            "eval_rollout_logs",
            "checkpoint_callbacks",
        ):
            getattr(self, kind)
        for kind in ("advantage", "reward_post_process", "rollout_data_postprocess", "pg_loss_reducer"):
            getattr(self, kind)
        self.tis_function  # noqa: B018 (resolved to fail early)
        self.convert_samples_to_train_data  # noqa: B018
        for kind in (*MEGATRON_HOOKS, "update_weight_post_write"):
            getattr(self, kind)
        if getattr(args, "train", False):
            trainer = self.trainer
            assert trainer is not None
            self.loss  # noqa: B018 (resolved to fail early; the trainer builds its own from args)
            if trainer.record.check is not None:
                trainer.record.check(args)

    # ----- the run's plugins, by kind -------------------------------------------------------------

    @property
    def generate_rollout(self) -> Resolved[Any]:
        """generate_rollout: one whole training step (``rollout_function_path``)."""
        resolved = self._named("generate_rollout", self.args.rollout_function_path)
        assert resolved is not None
        return resolved

    @property
    def eval_rollout(self) -> Resolved[Any]:
        """generate_rollout for eval (``eval_function_path``, else the training one)."""
        return self._named("generate_rollout", getattr(self.args, "eval_function_path", None)) or (
            self.generate_rollout
        )

    @property
    def engine(self) -> Resolved[Any]:
        resolved = self._named("engine", engine_name(self.args))
        assert resolved is not None
        return resolved

    @property
    def custom_generate(self) -> Resolved[Any]:
        """The run's custom_generate (``custom_generate_function_path``, default ``single_turn``)."""
        spec = getattr(self.args, "custom_generate_function_path", None) or DEFAULT_GENERATE
        resolved = self._named("custom_generate", spec)
        assert resolved is not None
        return resolved

    def generator_for(self, sample: Sample) -> Resolved[Any]:
        """The sample's own ``generate_function_path`` (slime's per-sample override) or the run's."""
        spec = sample.generate_function_path
        return self.resolve("custom_generate", spec) if spec else self.custom_generate

    @property
    def reward(self) -> Resolved[Any]:
        """The run's reward: ``custom_rm_path`` (a group reward with ``group_rm``), else ``rm_type``."""
        args = self.args
        custom = getattr(args, "custom_rm_path", None)
        if custom:
            return self.resolve("reward", custom, group=bool(getattr(args, "group_rm", False)))
        return self.resolve("reward", args.rm_type)

    @property
    def dynamic_filter(self) -> Resolved[Any] | None:
        return self._named("dynamic_filter", getattr(self.args, "dynamic_sampling_filter_path", None))

    @property
    def over_sampling_filter(self) -> Resolved[Any] | None:
        return self._named("over_sampling_filter", getattr(self.args, "over_sampling_filter_path", None))

    @property
    def buffer_filter(self) -> Resolved[Any]:
        """The buffer filter (``buffer_filter_path``, default ``pop_first``)."""
        resolved = self._named("buffer_filter", getattr(self.args, "buffer_filter_path", None) or "pop_first")
        assert resolved is not None
        return resolved

    @property
    def trainer(self) -> Resolved[Any] | None:
        return self._named("trainer", getattr(self.args, "trainer", None))

    @property
    def loss(self) -> Resolved[Any] | None:
        return self._named("loss", loss_spec(self.args))

    @property
    def agent(self) -> Resolved[Any] | None:
        return self._named("agent", getattr(self.args, "agent_function_path", None))

    @property
    def tool_call_parser(self) -> Resolved[Any] | None:
        """The tool-call parser the run names; None for ``auto`` (the chat endpoint picks one by the chat
        template, :func:`rlsdk.agents.server.resolve_parser`)."""
        spec = getattr(self.args, "tool_call_parser", None)
        return None if spec == "auto" else self._named("tool_call_parser", spec)

    # ----- slime's other extension points ------------------------------------------------------------

    def _named_list(self, kind: str, specs: Any) -> list[Resolved[Any]]:
        """Every plugin ``specs`` names, in order: a list of names or paths, or one string of them joined by
        commas (``jsonl,tensorboard``)."""
        names = [specs] if isinstance(specs, str) else list(specs or [])
        key = (kind, "\0".join(names))
        if key not in self._lists:
            parts = [part.strip() for name in names for part in name.split(",")]
            self._lists[key] = [self.resolve(kind, part) for part in parts if part]
        return self._lists[key]

    @property
    def sample_hooks(self) -> list[Resolved[Any]]:
        """The sample hooks, in order (``rollout_sample_hook_path``)."""
        return self._named_list("sample_hook", getattr(self.args, "rollout_sample_hook_path", None))

    @property
    def rollout_sample_filter(self) -> Resolved[Any] | None:
        return self._named("rollout_sample_filter", getattr(self.args, "rollout_sample_filter_path", None))

    @property
    def all_samples_process(self) -> Resolved[Any] | None:
        return self._named(
            "all_samples_process", getattr(self.args, "rollout_all_samples_process_path", None)
        )

    @property
    def data_source(self) -> Resolved[Any] | None:
        """The data source plugin (``data_source_path``); None: rlsdk's :class:`rlsdk.DataSource`."""
        return self._named("data_source", getattr(self.args, "data_source_path", None))

    @property
    def rollout_logs(self) -> list[Resolved[Any]]:
        """The step logging backends (``custom_rollout_log_function_path``, several by commas)."""
        return self._named_list("rollout_log", getattr(self.args, "custom_rollout_log_function_path", None))

    @property
    def eval_rollout_logs(self) -> list[Resolved[Any]]:
        """The eval logging backends (``custom_eval_rollout_log_function_path``, several by commas)."""
        spec = getattr(self.args, "custom_eval_rollout_log_function_path", None)
        return self._named_list("eval_rollout_log", spec)

    @property
    def checkpoint_callbacks(self) -> list[Resolved[Any]]:
        """The callbacks after each checkpoint (``checkpoint_callback``, several by commas)."""
        return self._named_list("checkpoint_callback", getattr(self.args, "checkpoint_callback", None))

    @property
    def advantage(self) -> Resolved[Any] | None:
        """The advantage estimator plugin (``custom_advantage_function_path``); None: the built-in ones."""
        return self._named("advantage", getattr(self.args, "custom_advantage_function_path", None))

    @property
    def reward_post_process(self) -> Resolved[Any] | None:
        return self._named("reward_post_process", getattr(self.args, "custom_reward_post_process_path", None))

    @property
    def rollout_data_postprocess(self) -> Resolved[Any] | None:
        return self._named(
            "rollout_data_postprocess", getattr(self.args, "rollout_data_postprocess_path", None)
        )

    @property
    def convert_samples_to_train_data(self) -> Resolved[Any] | None:
        spec = getattr(self.args, "custom_convert_samples_to_train_data_path", None)
        return self._named("convert_samples_to_train_data", spec)

    @property
    def pg_loss_reducer(self) -> Resolved[Any] | None:
        return self._named(
            "pg_loss_reducer", getattr(self.args, "custom_pg_loss_reducer_function_path", None)
        )

    @property
    def tis_function(self) -> Resolved[Any] | None:
        return self._named("tis_function", getattr(self.args, "custom_tis_function_path", None))

    @property
    def megatron_init(self) -> Resolved[Any] | None:
        return self._named("megatron_init", getattr(self.args, "custom_megatron_init_path", None))

    @property
    def megatron_before_log_prob(self) -> Resolved[Any] | None:
        spec = getattr(self.args, "custom_megatron_before_log_prob_hook_path", None)
        return self._named("megatron_before_log_prob", spec)

    @property
    def megatron_before_train_step(self) -> Resolved[Any] | None:
        spec = getattr(self.args, "custom_megatron_before_train_step_hook_path", None)
        return self._named("megatron_before_train_step", spec)

    @property
    def model_provider(self) -> Resolved[Any] | None:
        return self._named("model_provider", getattr(self.args, "custom_model_provider_path", None))

    @property
    def update_weight_post_write(self) -> Resolved[Any] | None:
        spec = getattr(self.args, "custom_update_weight_post_write_path", None)
        return self._named("update_weight_post_write", spec)

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
    async def boxed_reward(args: Any, sample: Any, evaluation: bool = False) -> Any:
        target = [_boxed_sample(s) for s in sample] if inner.record.group else _boxed_sample(sample)
        return await call_reward(args, inner, target, evaluation=evaluation)

    return boxed_reward
