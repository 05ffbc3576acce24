"""The options of ``rlsdk run --train``, with slime's names, defaults and meanings.

:class:`rlsdk.RolloutConfig` inherits these fields, so a trainer and a loss read them from ``args``
exactly as slime's do (``args.eps_clip``, ``args.kl_loss_coef``, ...). ``rlsdk run`` turns each field
into a command-line option (``--eps-clip``, ``--use-kl-loss``) with the field's docstring as its help.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .algorithm_options import AlgorithmOptions

ADVANTAGE_ESTIMATORS = (
    "grpo",
    "gspo",
    "cispo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "reinforce",
    "rloo",
    "sapo",
    "ppo",
)
LOSS_TYPES = ("policy_loss", "sft_loss", "custom_loss")
KL_LOSS_TYPES = ("k1", "k2", "k3", "low_var_kl")
WEIGHT_SYNC_MODES = ("auto", "tensor", "nccl", "disk")
WEIGHTS_CHECK_MODES = ("auto", "on", "off")


UPDATE_WEIGHT_BUFFER_SIZE = 512 * 2**20
"""Bytes of weights a ``tensor`` or ``nccl`` sync sends at a time unless told (slime's default, 512 MiB)."""


@dataclass
class TrainingOptions(AlgorithmOptions):
    """Trainer, optimizer, loss and checkpoint options (used with ``train``)."""

    # --- the loop ---
    train: bool = False
    """Train the policy on every step's kept samples and sync the new weights to the engine."""
    trainer: str = "torch"
    """The trainer plugin (``torch``, or another by name or dotted path)."""
    lr: float = 1e-6
    """AdamW learning rate (slime's default 1e-6; the default demo sets its own)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    """Clip the global gradient norm to this value before every optimizer step (0 turns clipping off)."""
    global_batch_size: int | None = None
    """Samples per optimizer step; default every sample of the step (one optimizer step per rollout)."""
    num_steps_per_rollout: int | None = None
    """Optimizer steps per rollout step: sets ``global_batch_size`` to the step's samples divided by it."""
    micro_batch_size: int = 8
    """Samples per forward/backward pass; gradients accumulate over a global batch."""
    max_tokens_per_gpu: int | None = None
    """Pack micro-batches up to this many (padded) tokens instead of ``micro_batch_size`` samples."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, about a third more compute."""
    train_dtype: str = "auto"
    """Trainer weights: ``auto`` (float32 on CPU, bfloat16 on CUDA), ``float32`` or ``bfloat16``."""
    train_device: str = "auto"
    """Trainer device: ``auto`` (CUDA when available), ``cpu`` or ``cuda``."""
    train_threads: int | None = None
    """CPU threads for the trainer's torch; default every core."""

    # --- advantages and losses ---
    advantage_estimator: str = "grpo"
    """``grpo``, ``gspo``, ``cispo``, ``reinforce_plus_plus``, ``reinforce_plus_plus_baseline``, ``reinforce``,
    ``rloo``, ``sapo`` or ``ppo`` (with a critic; see docs/training.md)."""
    custom_advantage_function_path: str | None = None
    """An advantage plugin (or dotted path) ``fn(args, rollout_data)`` that sets ``rollout_data["advantages"]``
    in place of ``advantage_estimator``."""
    custom_reward_post_process_path: str | None = None
    """A reward_post_process plugin ``fn(args, samples) -> (raw_rewards, rewards)`` in place of the group
    normalization."""
    rollout_data_postprocess_path: str | None = None
    """A rollout_data_postprocess plugin ``fn(args, rollout_id, rollout_data)`` that edits the step's training
    data once its log-probs are in."""
    custom_convert_samples_to_train_data_path: str | None = None
    """A convert_samples_to_train_data plugin ``fn(args, samples) -> dict`` (slime's trainer, or a trainer
    that reads slime's training-data dict; rlsdk's torch trainer builds its own batches)."""
    custom_pg_loss_reducer_function_path: str | None = None
    """A pg_loss_reducer plugin ``fn(total_lengths, response_lengths, loss_masks, calculate_per_token_loss)``
    that reduces the policy-gradient term (the others keep the sample mean)."""
    custom_tis_function_path: str | None = None
    """With ``use_tis``: a tis_function plugin, called by keyword as slime calls it, in place of the clipped
    ratio."""
    loss_type: str = "policy_loss"
    """``policy_loss`` (PPO-style clipped policy gradient), ``sft_loss`` or ``custom_loss``."""
    custom_loss_function_path: str | None = None
    """With ``loss_type: custom_loss``: a loss plugin by name, or a dotted path with slime's signature."""
    eps_clip: float = 0.2
    """PPO clip range below 1 (and above, unless ``eps_clip_high``)."""
    eps_clip_high: float | None = None
    """PPO clip range above 1 (DAPO's clip-higher); default ``eps_clip``."""
    eps_clip_c: float | None = None
    """Dual-clip PPO's bound (> 1) on the loss of negative-advantage tokens."""
    use_kl_loss: bool = False
    """Add ``kl_loss_coef`` times the KL to the reference model to the loss (loads a reference model)."""
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "k1"
    """KL estimator: ``k1``, ``k2``, ``k3`` or ``low_var_kl`` (k3 clamped to [-10, 10])."""
    kl_coef: float = 0.0
    """KL penalty folded into the reward (reinforce_plus_plus estimators; loads a reference model)."""
    gamma: float = 1.0
    """Discount of ``reinforce_plus_plus`` returns and of PPO's GAE."""
    entropy_coef: float = 0.0
    """Subtract this times the mean entropy from the loss."""
    use_tis: bool | None = None
    """Truncated importance sampling: weight each token's loss by exp(train - rollout log-prob),
    clipped to [``tis_clip_low``, ``tis_clip``]. Default: on where samples can be stale (``train_async``
    or ``max_policy_version_lag`` above 0), unless ``use_rollout_logprobs`` (the ratio is then taken
    against the engine's log-probs already); else off."""
    tis_clip: float = 2.0
    tis_clip_low: float = 0.0
    use_rollout_logprobs: bool = False
    """Use the engine's log-probs as the old policy's in the ratio (no old-policy forward pass)."""
    calculate_per_token_loss: bool = False
    """Average the loss over tokens of the global batch instead of over samples."""
    disable_grpo_std_normalization: bool = False
    """Dr. GRPO: subtract the group mean reward without dividing by the group's standard deviation."""
    disable_rewards_normalization: bool = False
    """Use raw rewards as advantages (no group mean subtracted)."""
    normalize_advantages: bool = False
    """Whiten advantages over the batch's trained tokens."""
    ref_load: str | None = None
    """Hugging Face folder of the reference model for KL terms; default the starting policy."""

    # --- GPUs: launched SGLang engines, weight sync, model parallelism (slime's names) ---
    rollout_num_gpus: int | None = None
    """GPUs for the SGLang engines ``engine: sglang`` launches (no ``sglang_url``); default one engine's."""
    rollout_num_gpus_per_engine: int = 1
    """GPUs per launched SGLang engine (its tensor-parallel size); several engines get a router in front."""
    rollout_engine_index: int = 0
    """Index of the first SGLang engine this process launches: its seed is ``rollout_seed + index`` and its
    log ``logs/sglang-server-<index>.log``. Set per engine actor on Ray (each launches one engine)."""
    colocate: bool = False
    """Trainer and engines share the GPUs: the engines release their memory while the trainer runs and
    take the weights as CUDA tensors (``update_weights_from_tensor``), never through disk."""
    sglang_mem_fraction_static: float | None = None
    """GPU memory fraction a launched SGLang engine reserves for weights and KV cache (SGLang's default
    when unset; with ``colocate`` leave room for the trainer). Any other ``sglang_*`` key in a config
    file, ``--set`` or an unknown ``--sglang-*`` flag is passed to the servers as ``--*``."""
    sglang_startup_timeout: float = 900.0
    """Seconds a launched SGLang engine (or router) may take to answer ``/health_generate``."""
    weight_sync: str = "auto"
    """How weights reach a GPU engine: ``tensor`` (CUDA IPC, needs ``colocate``), ``nccl`` (a broadcast
    group with the engines), ``disk`` (a Hugging Face folder); ``auto``: in process for the embedded
    engine, else ``tensor`` with ``colocate``, else ``disk``."""
    update_weight_buffer_size: int = UPDATE_WEIGHT_BUFFER_SIZE
    """Bytes of weights a ``tensor`` or ``nccl`` sync sends at a time (slime's name; 512 MiB): the trainer
    gathers and the engines load one bucket of this size after another, never the whole model at once."""
    custom_update_weight_post_write_path: str | None = None
    """With ``weight_sync disk``: an update_weight_post_write plugin ``fn(args, version_dir, rollout_engines)``
    called after each version's files are written, before the engines read them."""
    update_weight_mode: str = "full"
    """``full`` sends every tensor each sync; ``delta`` (disk only, slime's) publishes only the changed bytes
    under ``update_weight_disk_dir`` and each engine's host patches ``update_weight_local_checkpoint_dir``
    (:mod:`rlsdk.training.delta_sync`)."""
    update_weight_disk_dir: str | None = None
    """The folder disk syncs write to (shared with the engines' hosts); default ``weights/`` in the output
    folder."""
    update_weight_local_checkpoint_dir: str | None = None
    """With ``update_weight_mode delta``: the full checkpoint on the engine's host that the deltas patch and the
    engine reloads; default ``weights-local/`` in the output folder."""
    update_weight_delta_encoding: str = "xor"
    """A delta's encoding: ``xor`` (smallest, applied once on its base) or ``overwrite`` (idempotent)."""
    update_weight_delta_checksum: str = "xxh3-128"
    """Each delta tensor's checksum after it is applied: ``xxh3-128``, ``blake3`` (the blake3 package) or
    ``adler32``."""
    actor_num_gpus_per_node: int | None = None
    """GPUs the trainer trains on, one process each (its world size; one node); default
    ``tensor_model_parallel_size`` x ``pipeline_model_parallel_size``. The ``torch`` trainer uses one."""
    tensor_model_parallel_size: int = 1
    """megatron trainer: tensor-parallel size (data-parallel size is the world size over TP x PP)."""
    pipeline_model_parallel_size: int = 1
    """megatron trainer: pipeline-parallel size."""
    expert_model_parallel_size: int = 1
    """megatron trainer: expert-parallel size for MoE models (the experts split over this many of the
    data-parallel ranks; tokens reach them all-to-all)."""
    custom_megatron_init_path: str | None = None
    """megatron trainer: a megatron_init plugin (or dotted path) ``fn(args)`` called on every rank once megatron
    is initialised, before the model is built."""
    custom_megatron_before_log_prob_hook_path: str | None = None
    """megatron trainer: a megatron_before_log_prob plugin ``fn(args, model, store_prefix)`` called before each
    log-prob computation."""
    custom_megatron_before_train_step_hook_path: str | None = None
    """megatron trainer: a megatron_before_train_step plugin ``fn(args, rollout_id, step_id, model, optimizer,
    opt_param_scheduler)`` called before each optimizer step's passes."""
    custom_model_provider_path: str | None = None
    """megatron trainer: a model_provider plugin ``fn(pre_process, post_process, vp_stage=None) -> GPTModel``
    that builds the model in place of the trainer's ``GPTModel`` (the checkpoint's weights are loaded into it)."""
    offload: bool = False
    """Both ``offload_train`` and ``offload_rollout`` (slime's ``--offload``)."""
    offload_train: bool | None = None
    """With ``colocate``: the trainer moves its optimizer state and gradients to CPU memory while the engines
    generate, and back before it trains. Default: on with ``colocate`` (as slime)."""
    offload_rollout: bool | None = None
    """With ``colocate``: the engines release their GPU memory (weights, KV cache, CUDA graphs) while the
    trainer trains, and take it back for the weight sync. Default: on with ``colocate`` (as slime)."""

    # --- asynchronous training (docs/async.md) ---
    train_async: bool = False
    """``--async``: the next rollout step generates while the trainer trains on the current one (one step
    off-policy, slime's ``train_async.py``); weights reach the engines between rollout steps."""
    max_policy_version_lag: int | None = None
    """Engines generate continuously, up to this many policy versions ahead of the trainer (slime's name): a
    group sampled more than this many versions before the trainer's when the trainer takes it is dropped
    (``drop_reason: stale_policy``, in discarded.jsonl); ``0`` means the current policy only."""
    weight_sync_timeout: float | None = None
    """Seconds a weight sync (push to every engine) may take before its engine counts as dead (replaced on
    Ray, else the run stops naming the engine); default 120 plus 60 per GiB of the model's files."""

    # --- sync, checkpoints, reporting ---
    sync_check_tol: float | None = None
    """After each weight sync the engine's and trainer's log-probs of a probe sample may differ by at
    most this (nats); above it the run stops (the engine serves other weights than the trainer's).
    Default 0.05 with the trainer on CPU (float32 on both sides), 2.0 on CUDA (the engine serves bfloat16)."""
    weights_check: str = "auto"
    """After each weight sync, compare the checksum of every tensor each engine holds (SGLang's
    ``/weights_checker``, the embedded engine's) with the trainer's: a tensor the sync missed stops the run,
    named. ``auto``: on with the trainer on CUDA, where bfloat16's noise hides one missed tensor from the
    log-prob checks (off on CPU, where float32's do not, and a checksum of every weight costs seconds);
    ``on``; ``off``. Where it verified every tensor, a log-prob gap over ``sync_check_tol`` is numeric
    noise: a warning, not a failure. LoRA runs compare log-probs only (the adapter is not in the weights)."""
    save: str | None = None
    """Folder for checkpoints (``step_N/``); default ``<output_dir>/checkpoints`` when ``save_interval`` is set."""
    save_interval: int | None = None
    """Save a checkpoint every this many steps (and after the last)."""
    keep_last_n: int | None = None
    """Keep only the newest this many checkpoints, removing older ones as new ones are written (verl's
    ``max_actor_ckpt_to_keep``, Hugging Face's ``save_total_limit``); none keeps every one."""
    report_to: str | None = None
    """``tensorboard``: also write TensorBoard event files to ``<output_dir>/tensorboard``."""


def stale_samples(args: Any) -> bool:
    """Whether the trainer may take samples an older policy generated (``--async`` or a lag above 0)."""
    return bool(args.train_async or args.max_policy_version_lag)


def tis_on(args: Any) -> bool:
    """Whether the policy loss applies truncated importance sampling: ``use_tis``, or when unset, whether
    samples can be stale (and the ratio is not already taken against the engine's log-probs)."""
    if args.use_tis is not None:
        return bool(args.use_tis)
    return stale_samples(args) and not args.use_rollout_logprobs


def overlapped(args: Any) -> bool:
    """Whether rollouts overlap training (``--async`` or ``--max-policy-version-lag``)."""
    return bool(args.train_async) or args.max_policy_version_lag is not None


def trainer_world_size(args: TrainingOptions) -> int:
    """The trainer's processes (one per GPU): ``actor_num_gpus_per_node``, default TP x PP x EP."""
    return args.actor_num_gpus_per_node or (
        args.tensor_model_parallel_size * args.pipeline_model_parallel_size * args.expert_model_parallel_size
    )


def offloads(args: Any) -> tuple[bool, bool]:
    """``(offload_train, offload_rollout)``: each as set, else on with ``offload`` or ``colocate``."""
    default = bool(getattr(args, "offload", False) or getattr(args, "colocate", False))
    train, rollout = getattr(args, "offload_train", None), getattr(args, "offload_rollout", None)
    return (default if train is None else train), (default if rollout is None else rollout)


def named_model_folder(args: Any) -> Path | None:
    """The model folder the command line names, before any engine starts: ``hf_checkpoint``, else ``model``
    where it is a folder (not a name the engine resolves); None otherwise."""
    return next((Path(f) for f in (args.hf_checkpoint, args.model) if f and Path(f).is_dir()), None)


def loss_spec(args: TrainingOptions) -> str:
    """The loss plugin ``args`` select: ``loss_type``, or ``custom_loss_function_path`` for ``custom_loss``."""
    return (args.custom_loss_function_path or "") if args.loss_type == "custom_loss" else args.loss_type


def option_docs(cls: type = TrainingOptions) -> dict[str, str]:
    """Each field's docstring (the string literal under it), for ``--help``."""
    import ast
    import inspect
    import itertools
    import textwrap

    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body  # type: ignore[attr-defined]
    docs = {}
    for field_node, doc in itertools.pairwise(body):
        if (
            isinstance(field_node, ast.AnnAssign)
            and isinstance(field_node.target, ast.Name)
            and isinstance(doc, ast.Expr)
            and isinstance(doc.value, ast.Constant)
        ):
            text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", str(doc.value.value))  # Sphinx roles read as code
            docs[field_node.target.id] = " ".join(text.replace("``", "`").split())
    return docs
