"""The trainer's kinds (slime's training extension points, the megatron trainer's hooks and the weight sync's),
each declared once as in :mod:`rlsdk.plugins.kinds.rollout`."""

from __future__ import annotations

from argparse import Namespace

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from ...types import Sample
from ..records import Option, PluginArgs, PluginRecord
from ...options import RunOptions


__all__ = [
    "Advantage",
    "CheckpointCallback",
    "ConvertSamplesToTrainData",
    "Loss",
    "MegatronBeforeLogProb",
    "MegatronBeforeTrainStep",
    "MegatronInit",
    "ModelProvider",
    "PgLossReducer",
    "RewardPostProcess",
    "RolloutDataPostprocess",
    "TisFunction",
    "Trainer",
    "UpdateWeightPostWrite",
]


class TrainerCall(Protocol):
    """``trainer``'s call."""

    def __call__(self, args: PluginArgs, /) -> Any: ...


@dataclass
class Trainer(PluginRecord):
    """``trainer(args) -> rlsdk.trainer_api.PolicyTrainer``: a factory for the policy trainer of ``rlsdk run --train``.

    The hook provides policy trainers for ``rlsdk run --train`` (``--trainer NAME``).

    The callable is a factory ``trainer(args) -> rlsdk.trainer_api.PolicyTrainer``: an object that trains on a
    step's kept samples, reports per-token log-probs for the trust check, hands its weights to the
    engine and saves and loads checkpoints. Heavy imports (torch, megatron) belong inside the factory.

    - ``args``: the run's :class:`rlsdk.RolloutConfig` (slime's training option names: ``lr``,
        ``global_batch_size``, ``micro_batch_size``, ``eps_clip``, ...).

    **Example:**

    .. code-block:: python

        from rlsdk import Trainer, hookimpl

        def frozen_embeddings(args):
            from rlsdk.trainer_api import TorchTrainer

            trainer = TorchTrainer(args)
            trainer.model.get_input_embeddings().requires_grad_(False)
            return trainer

        @hookimpl
        def rlsdk_trainers():
            yield Trainer(name="frozen_embeddings", func=frozen_embeddings,
                          description="The torch trainer with frozen input embeddings")
    """

    kind: ClassVar[str] = "trainer"
    call_args: ClassVar[tuple[str, ...]] = ("args",)
    scope: ClassVar[str] = "run"
    options: ClassVar[tuple[Option, ...]] = (
        Option("trainer", str, "torch", "The trainer plugin (`torch`, or another by name or dotted path)."),
    )
    func: TrainerCall
    check: Callable[[Any], None] | None = None
    """``check(args)``: raises on settings this trainer cannot train with (a parallel size the model cannot
    be split by, say); ``rlsdk run`` calls it before any engine starts, so the error does not wait for them."""


class LossCall(Protocol):
    """``loss``'s call."""

    def __call__(self, args: PluginArgs, batch: Any, logits: Any, sum_of_sample_mean: Any, /) -> Any: ...


@dataclass
class Loss(PluginRecord):
    """``loss(args, batch, logits, sum_of_sample_mean) -> (loss, metrics)``: slime's custom-loss signature.

    The hook provides losses for ``--loss-type custom_loss --custom-loss-function-path NAME``.

    The callable has slime's custom-loss signature ``loss(args, batch, logits, sum_of_sample_mean)``
    and returns ``(loss, metrics)``: a scalar tensor and a dict of detached scalar tensors.

    - ``args``: the run's :class:`rlsdk.RolloutConfig`.
    - ``batch``: one micro-batch as slime builds it: ``unconcat_tokens``, ``total_lengths``,
        ``response_lengths``, ``loss_masks``, ``advantages``, ``log_probs`` (before this step),
        ``rollout_log_probs``, ``ref_log_probs`` (with a KL term) and ``rewards``; lists with one
        tensor (or number) per sample.
    - ``logits``: the packed logits ``[1, sum(total_lengths), vocab]`` of the micro-batch's samples;
        for a record with ``logits="response"``, only the rows that predict response tokens,
        ``[1, sum(response_lengths), vocab]`` (less time and memory; ``log_probs_and_entropy`` and
        ``response_logits`` read either).
    - ``sum_of_sample_mean``: reduces a packed per-response-token tensor to the sum over samples of
        each sample's masked mean (or the masked token sum with ``--calculate-per-token-loss``).

    **Example:**

    .. code-block:: python

        from rlsdk import Loss, hookimpl
        from rlsdk import log_probs_and_entropy

        def reinforce(args, batch, logits, sum_of_sample_mean):
            import torch

            log_probs, _ = log_probs_and_entropy(logits, batch, args, with_entropy=False)
            advantages = torch.cat(batch["advantages"])
            loss = sum_of_sample_mean(-advantages * torch.cat(log_probs))
            return loss, {"loss": loss.detach()}

        @hookimpl
        def rlsdk_losses():
            yield Loss(name="reinforce", func=reinforce, logits="response", description="Plain REINFORCE")
    """

    kind: ClassVar[str] = "loss"
    hook: ClassVar[str] = "rlsdk_losses"
    call_args: ClassVar[tuple[str, ...]] = ("args", "batch", "logits", "sum_of_sample_mean")
    scope: ClassVar[str] = "micro_batch"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "custom_loss_function_path",
            str,
            None,
            "With `loss_type: custom_loss`: a loss plugin by name, or a dotted path with slime's signature.",
        ),
    )
    func: LossCall

    @classmethod
    def chosen(cls, args: RunOptions | Namespace) -> Any:
        """``loss_type``, or ``custom_loss_function_path`` for ``custom_loss``."""
        if args.loss_type == "custom_loss":
            return getattr(args, "custom_loss_function_path", None) or ""
        return args.loss_type

    logits: str = "packed"
    """The ``logits`` the loss gets: ``packed``, slime's ``[1, sum(total_lengths), vocab]`` (what a slime
    loss reads, and a dotted-path loss gets), or ``response``, only the rows that predict response tokens,
    ``[1, sum(response_lengths), vocab]``: the trainer then computes no vocabulary projection for prompt
    positions and holds no copy of a group's prompt rows per sample. A loss that reads the logits through
    :func:`rlsdk.response_logits` (or ``log_probs_and_entropy``) works with either."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.logits not in ("packed", "response"):
            raise ValueError(
                f"loss {self.name!r}: logits must be 'packed' or 'response', got {self.logits!r}"
            )


class AdvantageCall(Protocol):
    """``advantage``'s call."""

    def __call__(self, args: PluginArgs, rollout_data: dict[str, Any], /) -> Any: ...


@dataclass
class Advantage(PluginRecord):
    """``advantage(args, rollout_data) -> None``: sets ``rollout_data["advantages"]`` (one per-token tensor per
    sample) in place of the built-in estimators (slime's ``--custom-advantage-function-path``).

    The hook provides advantage estimators (``--custom-advantage-function-path NAME``).

    The callable is slime's ``advantage(args, rollout_data) -> None``: it sets ``rollout_data["advantages"]``
    (one float tensor per sample, one entry per response token) in place. ``rollout_data`` holds one entry per
    sample, the step's kept samples in group order:

    - ``rewards``: floats after post-processing: the ``reward_post_process`` plugin's, else the group
      normalization (GRPO's reward minus its group's mean, over the group's std unless
      ``--disable-grpo-std-normalization``), then whatever ``rollout_data_postprocess`` left; the raw rewards
      are not here (``rollout_data_postprocess`` sees them as ``raw_reward``);
    - ``kl``: per-token tensors, the policy's KL to the reference (zeros without ``--kl-coef``);
    - ``loss_masks``: per-token 0/1 tensors; ``response_lengths``, ``total_lengths``: ints;
    - ``rollout_log_probs``: the engine's per-token log-probs (tensors, None for a sample without them);
      ``log_probs``, ``ref_log_probs``: the
      trainer's old-policy and reference per-token tensors, empty lists where the step did not compute them;
    - with ``--advantage-estimator ppo`` also ``values``, the critic's per-token tensors, and the plugin must
      set ``rollout_data["returns"]`` (the critic's targets; the step fails naming the plugin otherwise).

    There are no group ids: a plugin that needs the groups works in ``reward_post_process``, whose samples
    carry ``group_index``.

    - ``args``: the run's :class:`rlsdk.RolloutConfig`.
    - ``rollout_data``: the step's training data, one entry per sample in each list.

    **Example:**

    .. code-block:: python

        from rlsdk import Advantage, hookimpl

        def sign_only(args, rollout_data):
            import torch

            rollout_data["advantages"] = [
                torch.full_like(mask, float(reward > 0) - float(reward < 0), dtype=torch.float32)
                for reward, mask in zip(rollout_data["rewards"], rollout_data["loss_masks"])
            ]
            rollout_data["returns"] = rollout_data["advantages"]

        @hookimpl
        def rlsdk_advantages():
            yield Advantage(name="sign_only", func=sign_only, description="+1, 0 or -1 per sample")
    """

    kind: ClassVar[str] = "advantage"
    slime: ClassVar[bool] = True
    call_args: ClassVar[tuple[str, ...]] = ("args", "rollout_data")
    scope: ClassVar[str] = "step"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "custom_advantage_function_path",
            str,
            None,
            'An advantage plugin (or dotted path) `fn(args, rollout_data)` that sets `rollout_data["advantages"]` in place of `advantage_estimator`.',
        ),
    )
    func: AdvantageCall


class RewardPostProcessCall(Protocol):
    """``reward_post_process``'s call."""

    def __call__(self, args: PluginArgs, samples: list[Sample], /) -> Any: ...


@dataclass
class RewardPostProcess(PluginRecord):
    """``post_process(args, samples) -> (raw_rewards, rewards)``: the rewards the trainer turns into advantages,
    in place of the group normalization (slime's ``--custom-reward-post-process-path``).

    The hook provides reward post-processing (``--custom-reward-post-process-path NAME``), in place of the group
    normalization of the group estimators.

    The callable is slime's ``post_process(args, samples) -> (raw_rewards, rewards)``: two lists of floats,
    one per sample; ``rewards`` become the advantages' source.

    - ``args``: the run's :class:`rlsdk.RolloutConfig`.
    - ``samples``: the step's kept samples, flat, group by group.

    **Example:**

    .. code-block:: python

        from rlsdk import RewardPostProcess, hookimpl

        def centered(args, samples):
            raw = [s.get_reward_value(args) for s in samples]
            mean = sum(raw) / len(raw)
            return raw, [r - mean for r in raw]

        @hookimpl
        def rlsdk_reward_post_processes():
            yield RewardPostProcess(name="batch_centered", func=centered)
    """

    kind: ClassVar[str] = "reward_post_process"
    slime: ClassVar[bool] = True
    hook: ClassVar[str] = "rlsdk_reward_post_processes"
    call_args: ClassVar[tuple[str, ...]] = ("args", "samples")
    scope: ClassVar[str] = "step"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "custom_reward_post_process_path",
            str,
            None,
            "A reward_post_process plugin `fn(args, samples) -> (raw_rewards, rewards)` in place of the group normalization.",
        ),
    )
    func: RewardPostProcessCall


class RolloutDataPostprocessCall(Protocol):
    """``rollout_data_postprocess``'s call."""

    def __call__(self, args: PluginArgs, rollout_id: int, rollout_data: dict[str, Any], /) -> Any: ...


@dataclass
class RolloutDataPostprocess(PluginRecord):
    """``postprocess(args, rollout_id, rollout_data) -> None``: edits the training data once log-probs are in it
    (loss masks, say) (slime's ``--rollout-data-postprocess-path``).

    The hook provides training-data post-processing (``--rollout-data-postprocess-path NAME``), called once the
    step's data holds its log-probs, before advantages.

    The callable is slime's ``postprocess(args, rollout_id, rollout_data) -> None``; it edits
    ``rollout_data`` in place (``loss_masks``, ``rewards``, ...).

    - ``args``: the run's :class:`rlsdk.RolloutConfig`.
    - ``rollout_id``: the step.
    - ``rollout_data``: the step's training data, one entry per sample in each list.

    **Example:**

    .. code-block:: python

        from rlsdk import RolloutDataPostprocess, hookimpl

        def mask_truncated(args, rollout_id, rollout_data):
            for mask, truncated in zip(rollout_data["loss_masks"], rollout_data["truncated"]):
                if truncated:
                    mask.zero_()

        @hookimpl
        def rlsdk_rollout_data_postprocesses():
            yield RolloutDataPostprocess(name="mask_truncated", func=mask_truncated)
    """

    kind: ClassVar[str] = "rollout_data_postprocess"
    slime: ClassVar[bool] = True
    hook: ClassVar[str] = "rlsdk_rollout_data_postprocesses"
    call_args: ClassVar[tuple[str, ...]] = ("args", "rollout_id", "rollout_data")
    scope: ClassVar[str] = "step"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "rollout_data_postprocess_path",
            str,
            None,
            "A rollout_data_postprocess plugin `fn(args, rollout_id, rollout_data)` that edits the step's training data once its log-probs are in.",
        ),
    )
    func: RolloutDataPostprocessCall


class ConvertSamplesToTrainDataCall(Protocol):
    """``convert_samples_to_train_data``'s call."""

    def __call__(self, args: PluginArgs, samples: list[Sample], /) -> Any: ...


@dataclass
class ConvertSamplesToTrainData(PluginRecord):
    """``convert(args, samples) -> dict``: slime's training-data dict from a step's samples (``tokens``,
    ``response_lengths``, ``rewards``, ``raw_reward``, ``truncated``, ``sample_indices``, ``loss_masks``)
    (slime's ``--custom-convert-samples-to-train-data-path``).

    The hook provides converters of a step's samples to slime's training-data dict
    (``--custom-convert-samples-to-train-data-path NAME``): for slime's own trainer through
    ``rlsdk.slime.convert_samples_to_train_data.<name>``, and for trainers that read that dict.

    The callable is slime's ``convert(args, samples) -> dict`` with at least ``tokens``, ``response_lengths``,
    ``rewards``, ``raw_reward``, ``truncated``, ``sample_indices`` and ``loss_masks``.

    - ``args``: the run's :class:`rlsdk.RolloutConfig`.
    - ``samples``: the step's kept samples, flat.

    **Example:**

    .. code-block:: python

        from rlsdk import ConvertSamplesToTrainData, hookimpl

        def plain(args, samples):
            return {
                "tokens": [s.tokens for s in samples],
                "response_lengths": [s.response_length for s in samples],
                "rewards": [s.get_reward_value(args) for s in samples],
                "raw_reward": [s.get_reward_value(args) for s in samples],
                "truncated": [int(s.status == s.Status.TRUNCATED) for s in samples],
                "sample_indices": [s.index for s in samples],
                "loss_masks": [s.loss_mask or [1] * s.response_length for s in samples],
            }

        @hookimpl
        def rlsdk_train_data_converters():
            yield ConvertSamplesToTrainData(name="plain", func=plain)
    """

    kind: ClassVar[str] = "convert_samples_to_train_data"
    slime: ClassVar[bool] = True
    hook: ClassVar[str] = "rlsdk_train_data_converters"
    call_args: ClassVar[tuple[str, ...]] = ("args", "samples")
    scope: ClassVar[str] = "step"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "custom_convert_samples_to_train_data_path",
            str,
            None,
            "A convert_samples_to_train_data plugin `fn(args, samples) -> dict` (slime's trainer, or a trainer that reads slime's training-data dict; rlsdk's torch trainer builds its own batches).",
        ),
    )
    func: ConvertSamplesToTrainDataCall


class CheckpointCallbackCall(Protocol):
    """``checkpoint_callback``'s call."""

    def __call__(self, args: PluginArgs, rollout_id: int, path: str, /) -> Any: ...


@dataclass
class CheckpointCallback(PluginRecord):
    """``callback(args, rollout_id, path) -> None``: called after each checkpoint is complete (renamed into
    place, the run's state pointing at it), as verl's ``checkpoint_callback_class``.

    The hook provides callbacks run after each checkpoint is complete (``--checkpoint-callback a,b``), as verl's
    ``checkpoint_callback_class``: the folder is in place and the run's state points at it.

    The callable is ``callback(args, rollout_id, path) -> None``.

    - ``args``: the run's :class:`rlsdk.RolloutConfig`.
    - ``rollout_id``: the step the checkpoint follows.
    - ``path``: the checkpoint's folder (``step_<rollout_id>``, a Hugging Face model inside).

    **Example:**

    .. code-block:: python

        import shutil
        from rlsdk import CheckpointCallback, hookimpl

        def keep_copy(args, rollout_id, path):
            shutil.copytree(path, f"/backups/{path.name}", dirs_exist_ok=True)

        @hookimpl
        def rlsdk_checkpoint_callbacks():
            yield CheckpointCallback(name="keep_copy", func=keep_copy)
    """

    kind: ClassVar[str] = "checkpoint_callback"
    call_args: ClassVar[tuple[str, ...]] = ("args", "rollout_id", "path")
    scope: ClassVar[str] = "checkpoint"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "checkpoint_callback",
            str,
            None,
            "checkpoint_callback plugins (several joined by commas) called after each checkpoint is complete.",
        ),
    )
    many: ClassVar[bool] = True
    func: CheckpointCallbackCall


class PgLossReducerCall(Protocol):
    """``pg_loss_reducer``'s call."""

    def __call__(
        self,
        total_lengths: list[int],
        response_lengths: list[int],
        loss_masks: Any,
        calculate_per_token_loss: bool,
        /,
    ) -> Any: ...


@dataclass
class PgLossReducer(PluginRecord):
    """``reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss) -> reduce``: the function
    that reduces the per-token policy-gradient loss (only that; the other metrics keep ``sum_of_sample_mean``)
    (slime's ``--custom-pg-loss-reducer-function-path``).

    The hook provides reducers of the per-token policy-gradient loss (``--custom-pg-loss-reducer-function-path NAME``);
    the loss's other terms keep ``sum_of_sample_mean``.

    The callable is slime's ``reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss)``
    and returns ``reduce(x) -> scalar`` for a packed per-response-token tensor ``x``.

    - ``total_lengths``: prompt plus response tokens per sample.
    - ``response_lengths``: response tokens per sample.
    - ``loss_masks``: one 0/1 tensor per sample.
    - ``calculate_per_token_loss``: ``args.calculate_per_token_loss``.

    **Example:**

    .. code-block:: python

        from rlsdk import PgLossReducer, hookimpl

        def token_sum(total_lengths, response_lengths, loss_masks, calculate_per_token_loss):
            import torch

            mask = torch.cat(loss_masks)
            return lambda x: (x * mask).sum()

        @hookimpl
        def rlsdk_pg_loss_reducers():
            yield PgLossReducer(name="token_sum", func=token_sum)
    """

    kind: ClassVar[str] = "pg_loss_reducer"
    slime: ClassVar[bool] = True
    call_args: ClassVar[tuple[str, ...]] = (
        "total_lengths",
        "response_lengths",
        "loss_masks",
        "calculate_per_token_loss",
    )
    scope: ClassVar[str] = "micro_batch"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "custom_pg_loss_reducer_function_path",
            str,
            None,
            "A pg_loss_reducer plugin `fn(total_lengths, response_lengths, loss_masks, calculate_per_token_loss)` that reduces the policy-gradient term (the others keep the sample mean).",
        ),
    )
    func: PgLossReducerCall


class TisFunctionCall(Protocol):
    """``tis_function``'s call."""

    def __call__(
        self,
        *,
        args: PluginArgs,
        pg_loss: Any,
        train_log_probs: Any,
        rollout_log_probs: Any,
        loss_masks: Any,
        total_lengths: list[int],
        response_lengths: list[int],
    ) -> Any: ...


@dataclass
class TisFunction(PluginRecord):
    """``tis(*, args, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths)
    -> (pg_loss, loss_masks, metrics)``: truncated importance sampling (or rejection) of the per-token policy-
    gradient loss with ``--use-tis`` (slime's ``--custom-tis-function-path``), called by keyword as slime
    calls it.

    The hook provides truncated-importance-sampling functions for ``--use-tis`` (``--custom-tis-function-path NAME``).

    The callable is slime's, called by keyword: ``tis(*, args, pg_loss, train_log_probs, rollout_log_probs,
    loss_masks, total_lengths, response_lengths) -> (pg_loss, loss_masks, metrics)``: the weighted per-token
    loss, the loss masks to reduce it with (rejected tokens zeroed) and a dict of per-token tensors to report.

    - ``pg_loss``: the packed per-response-token policy-gradient loss.
    - ``train_log_probs``: the trainer's log-probs, one tensor per sample.
    - ``rollout_log_probs``: the engine's log-probs, one tensor per sample.

    **Example:**

    .. code-block:: python

        from rlsdk import TisFunction, hookimpl

        def clipped(*, args, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths,
                    response_lengths):
            import torch

            ratio = (torch.cat(train_log_probs) - torch.cat(rollout_log_probs)).exp().clamp(max=args.tis_clip)
            return pg_loss * ratio.detach(), loss_masks, {"tis": ratio.detach()}

        @hookimpl
        def rlsdk_tis_functions():
            yield TisFunction(name="clipped", func=clipped)
    """

    kind: ClassVar[str] = "tis_function"
    slime: ClassVar[bool] = True
    call_keywords: ClassVar[tuple[str, ...]] = (
        "args",
        "pg_loss",
        "train_log_probs",
        "rollout_log_probs",
        "loss_masks",
        "total_lengths",
        "response_lengths",
    )
    scope: ClassVar[str] = "micro_batch"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "custom_tis_function_path",
            str,
            None,
            "With `use_tis`: a tis_function plugin, called by keyword as slime calls it, in place of the clipped ratio.",
        ),
    )
    func: TisFunctionCall


class MegatronInitCall(Protocol):
    """``megatron_init``'s call."""

    def __call__(self, args: PluginArgs, /) -> Any: ...


@dataclass
class MegatronInit(PluginRecord):
    """``init(args) -> None``: called once on every trainer rank after megatron's parallel state is set up,
    before the model is built (slime's ``--custom-megatron-init-path``).

    The hook provides functions the ``megatron`` trainer calls once on every rank after megatron's parallel state is
    initialised, before it builds the model (``--custom-megatron-init-path NAME``).

    The callable is slime's ``init(args) -> None``.

    **Example:**

    .. code-block:: python

        from rlsdk import MegatronInit, hookimpl

        def deterministic(args):
            import torch

            torch.backends.cudnn.deterministic = True

        @hookimpl
        def rlsdk_megatron_inits():
            yield MegatronInit(name="deterministic", func=deterministic)
    """

    kind: ClassVar[str] = "megatron_init"
    slime: ClassVar[bool] = True
    call_args: ClassVar[tuple[str, ...]] = ("args",)
    scope: ClassVar[str] = "run"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "custom_megatron_init_path",
            str,
            None,
            "megatron trainer: a megatron_init plugin (or dotted path) `fn(args)` called on every rank once megatron is initialised, before the model is built.",
        ),
    )
    func: MegatronInitCall


class MegatronBeforeLogProbCall(Protocol):
    """``megatron_before_log_prob``'s call."""

    def __call__(self, args: PluginArgs, model: Any, store_prefix: str, /) -> Any: ...


@dataclass
class MegatronBeforeLogProb(PluginRecord):
    """``hook(args, model, store_prefix) -> None``: called before each log-prob computation of the megatron
    trainer, ``model`` its list of model chunks, ``store_prefix`` ``""`` (the policy) or ``"ref_"`` (the
    reference model) (slime's ``--custom-megatron-before-log-prob-hook-path``).

    The hook provides hooks the ``megatron`` trainer calls before each log-prob computation
    (``--custom-megatron-before-log-prob-hook-path NAME``).

    The callable is slime's ``hook(args, model, store_prefix) -> None``.

    - ``model``: the trainer's model chunks (a list of one ``GPTModel``).
    - ``store_prefix``: ``""`` for the policy's log-probs, ``"ref_"`` for the reference model's.

    **Example:**

    .. code-block:: python

        from rlsdk import MegatronBeforeLogProb, hookimpl

        def eval_mode(args, model, store_prefix):
            for chunk in model:
                chunk.eval()

        @hookimpl
        def rlsdk_megatron_before_log_probs():
            yield MegatronBeforeLogProb(name="eval_mode", func=eval_mode)
    """

    kind: ClassVar[str] = "megatron_before_log_prob"
    slime: ClassVar[bool] = True
    call_args: ClassVar[tuple[str, ...]] = ("args", "model", "store_prefix")
    scope: ClassVar[str] = "micro_batch"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "custom_megatron_before_log_prob_hook_path",
            str,
            None,
            "megatron trainer: a megatron_before_log_prob plugin `fn(args, model, store_prefix)` called before each log-prob computation.",
        ),
    )
    func: MegatronBeforeLogProbCall


class MegatronBeforeTrainStepCall(Protocol):
    """``megatron_before_train_step``'s call."""

    def __call__(
        self,
        args: PluginArgs,
        rollout_id: int,
        step_id: int,
        model: Any,
        optimizer: Any,
        opt_param_scheduler: Any,
        /,
    ) -> Any: ...


@dataclass
class MegatronBeforeTrainStep(PluginRecord):
    """``hook(args, rollout_id, step_id, model, optimizer, opt_param_scheduler) -> None``: called before each
    optimizer step's forward and backward passes of the megatron trainer, the gradients zeroed (slime's
    ``--custom-megatron-before-train-step-hook-path``); rlsdk has no LR scheduler: ``None``.

    The hook provides hooks the ``megatron`` trainer calls before each optimizer step's passes, gradients zeroed
    (``--custom-megatron-before-train-step-hook-path NAME``).

    The callable is slime's ``hook(args, rollout_id, step_id, model, optimizer, opt_param_scheduler) -> None``.

    - ``step_id``: the optimizer step within the rollout step, from 0.
    - ``model``: the trainer's model chunks (a list of one ``GPTModel``).
    - ``opt_param_scheduler``: ``None`` (rlsdk keeps the learning rate constant).

    **Example:**

    .. code-block:: python

        from rlsdk import MegatronBeforeTrainStep, hookimpl

        def warmup(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
            for group in optimizer.param_groups:
                group["lr"] = args.lr * min(1.0, (rollout_id + 1) / 10)

        @hookimpl
        def rlsdk_megatron_before_train_steps():
            yield MegatronBeforeTrainStep(name="warmup", func=warmup)
    """

    kind: ClassVar[str] = "megatron_before_train_step"
    slime: ClassVar[bool] = True
    call_args: ClassVar[tuple[str, ...]] = (
        "args",
        "rollout_id",
        "step_id",
        "model",
        "optimizer",
        "opt_param_scheduler",
    )
    scope: ClassVar[str] = "micro_batch"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "custom_megatron_before_train_step_hook_path",
            str,
            None,
            "megatron trainer: a megatron_before_train_step plugin `fn(args, rollout_id, step_id, model, optimizer, opt_param_scheduler)` called before each optimizer step's passes.",
        ),
    )
    func: MegatronBeforeTrainStepCall


class ModelProviderCall(Protocol):
    """``model_provider``'s call."""

    def __call__(self, *, pre_process: bool, post_process: bool) -> Any: ...


@dataclass
class ModelProvider(PluginRecord):
    """``provider(pre_process, post_process, vp_stage=None) -> GPTModel``: builds the megatron trainer's model in
    place of its own ``GPTModel`` (slime's ``--custom-model-provider-path``), called by keyword; the converted
    Hugging Face weights are then loaded into it, so its weights must keep ``GPTModel``'s names. ``vp_stage``,
    and rlsdk's ``config`` (the ``TransformerConfig`` the trainer would use) and ``model_kwargs`` (its other
    ``GPTModel`` arguments), are passed where the provider declares them.

    The hook provides model builders for the ``megatron`` trainer, in place of its ``GPTModel``
    (``--custom-model-provider-path NAME``).

    The callable is slime's ``provider(pre_process, post_process, vp_stage=None) -> GPTModel``, called by
    keyword; the checkpoint's converted weights are loaded into what it returns, so the weights keep
    ``GPTModel``'s names. Declare ``config=None`` and ``model_kwargs=None`` to get the ``TransformerConfig``
    and the other ``GPTModel`` arguments the trainer would use.

    **Example:**

    .. code-block:: python

        from rlsdk import ModelProvider, hookimpl

        def local_spec(pre_process, post_process, vp_stage=None, config=None, model_kwargs=None):
            from megatron.core.models.gpt import GPTModel
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

            spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization="RMSNorm")
            return GPTModel(config=config, transformer_layer_spec=spec, pre_process=pre_process,
                            post_process=post_process, **model_kwargs)

        @hookimpl
        def rlsdk_model_providers():
            yield ModelProvider(name="local_spec", func=local_spec)
    """

    kind: ClassVar[str] = "model_provider"
    slime: ClassVar[bool] = True
    call_keywords: ClassVar[tuple[str, ...]] = ("pre_process", "post_process")
    scope: ClassVar[str] = "run"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "custom_model_provider_path",
            str,
            None,
            "megatron trainer: a model_provider plugin `fn(pre_process, post_process, vp_stage=None) -> GPTModel` that builds the model in place of the trainer's `GPTModel` (the checkpoint's weights are loaded into it).",
        ),
    )
    func: ModelProviderCall


class UpdateWeightPostWriteCall(Protocol):
    """``update_weight_post_write``'s call."""

    def __call__(self, args: PluginArgs, version_dir: str, rollout_engines: Any, /) -> Any: ...


@dataclass
class UpdateWeightPostWrite(PluginRecord):
    """``hook(args, version_dir, rollout_engines) -> None``: called after a disk weight sync wrote a version's
    files into ``version_dir`` and before the engines read them (to publish them on a filesystem without
    cross-host consistency, say) (slime's ``--custom-update-weight-post-write-path``).

    The hook provides hooks called after a disk weight sync (``--weight-sync disk``) wrote a version's files and
    before the engines read them (``--custom-update-weight-post-write-path NAME``).

    The callable is slime's ``hook(args, version_dir, rollout_engines) -> None``.

    - ``version_dir``: the folder just written (a string).
    - ``rollout_engines``: the engines about to read it (:class:`rlsdk.engine_api.InferenceEngine` objects).

    **Example:**

    .. code-block:: python

        from rlsdk import UpdateWeightPostWrite, hookimpl

        def publish(args, version_dir, rollout_engines):
            import subprocess

            subprocess.run(["sync", "-f", version_dir], check=True)

        @hookimpl
        def rlsdk_update_weight_post_writes():
            yield UpdateWeightPostWrite(name="publish", func=publish)
    """

    kind: ClassVar[str] = "update_weight_post_write"
    slime: ClassVar[bool] = True
    call_args: ClassVar[tuple[str, ...]] = ("args", "version_dir", "rollout_engines")
    scope: ClassVar[str] = "sync"
    options: ClassVar[tuple[Option, ...]] = (
        Option(
            "custom_update_weight_post_write_path",
            str,
            None,
            "With `weight_sync disk`: an update_weight_post_write plugin `fn(args, version_dir, rollout_engines)` called after each version's files are written, before the engines read them.",
        ),
    )
    func: UpdateWeightPostWriteCall
