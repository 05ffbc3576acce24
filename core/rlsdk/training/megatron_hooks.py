"""The megatron trainer's plugin hooks, for the ``rlsdk-megatron`` trainer: :class:`MegatronHooks`."""

from __future__ import annotations

from typing import Any

from ..plugins.calls import (
    call_megatron_before_log_prob,
    call_megatron_before_train_step,
    call_megatron_init,
    call_model_provider,
)
from ..runtime import plugins_of
from ..plugins.kinds import MegatronBeforeLogProb, MegatronBeforeTrainStep, MegatronInit, ModelProvider
from ..config import RolloutConfig


class MegatronHooks:
    """The run's ``megatron_init``, ``megatron_before_log_prob``, ``megatron_before_train_step`` and
    ``model_provider`` plugins (slime's ``--custom-megatron-init-path``, ``--custom-megatron-before-log-prob-
    hook-path``, ``--custom-megatron-before-train-step-hook-path`` and ``--custom-model-provider-path``),
    resolved once from ``args``. Each method calls its plugin through the kind's call point (an error names
    the plugin and its distribution) and does nothing where the run names none."""

    def __init__(self, args: RolloutConfig) -> None:
        self.args = args
        plugins = plugins_of(args)
        self.init_hook = plugins.get(MegatronInit)
        self.before_log_prob_hook = plugins.get(MegatronBeforeLogProb)
        self.before_train_step_hook = plugins.get(MegatronBeforeTrainStep)
        self.model_provider = plugins.get(ModelProvider)

    def init(self) -> None:
        """Once megatron's parallel state is set up, before the model is built."""
        if self.init_hook is not None:
            call_megatron_init(self.init_hook, self.args)

    def before_log_prob(self, model: list[Any], store_prefix: str) -> None:
        """Before the log-probs of ``model`` (its chunks): ``store_prefix`` ``""`` (policy) or ``"ref_"``."""
        if self.before_log_prob_hook is not None:
            call_megatron_before_log_prob(self.before_log_prob_hook, self.args, model, store_prefix)

    def before_train_step(
        self, rollout_id: int, step_id: int, model: list[Any], optimizer: Any, opt_param_scheduler: Any = None
    ) -> None:
        """Before optimizer step ``step_id`` of rollout ``rollout_id``'s forward and backward passes."""
        if self.before_train_step_hook is not None:
            call_megatron_before_train_step(
                self.before_train_step_hook,
                self.args,
                rollout_id,
                step_id,
                model,
                optimizer,
                opt_param_scheduler,
            )

    def provide_model(self, *, pre_process: bool, post_process: bool, **extra: Any) -> Any:
        """The model the run's ``model_provider`` builds (``extra``: ``vp_stage``, ``config``,
        ``model_kwargs``, passed where it declares them); None where the run names none."""
        if self.model_provider is None:
            return None
        return call_model_provider(
            self.model_provider, pre_process=pre_process, post_process=post_process, **extra
        )
