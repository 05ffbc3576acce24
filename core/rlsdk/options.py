"""A run's options as plain values: the sections of its configuration, each a frozen dataclass of options with
slime's names, defaults and meanings (:class:`RolloutOptions`, :class:`DataOptions`, :class:`RewardOptions`,
:class:`TrainingOptions`, :class:`AlgorithmOptions`, :class:`EngineOptions`, :class:`MegatronOptions`,
:class:`AgentsOptions`, :class:`OutputOptions`), each checking its own values, and :class:`RunOptions`, all of
them under slime's flat names (``args.lr``), the view slime's functions and rlsdk's plugins read, and by
section (``args.sections.training.lr``). :class:`rlsdk.RolloutConfig` builds and checks one (its kinds' and
plugins' options included). ``rlsdk run`` turns each field into a command-line option, its docstring the help.

The floors below the configuration (the plugin system, the engines) read the run's options through
:class:`RunOptions`: it needs nothing above them.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any


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
OPD_TYPES = ("sglang", "megatron")


UPDATE_WEIGHT_BUFFER_SIZE = 512 * 2**20
"""Bytes of weights a ``tensor`` or ``nccl`` sync sends at a time unless told (slime's default, 512 MiB)."""


def at_least_one(section: Any, name: str) -> None:
    if getattr(section, name) < 1:
        raise ValueError(f"{name} must be at least 1, got {getattr(section, name)}")


def one_of(section: Any, name: str, choices: tuple[str, ...]) -> None:
    if getattr(section, name) not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {getattr(section, name)!r}")


@dataclass(frozen=True)
class RolloutOptions:
    """The rollout step: steps, batch and group sizes, sampling, partial rollouts, timeouts, and eval's own sampling."""

    num_rollout: int = 3
    """Rollout steps to run."""
    rollout_batch_size: int = 4
    """Groups (prompts) kept per step."""
    n_samples_per_prompt: int = 4
    """Samples generated per prompt (the group size)."""
    over_sampling_batch_size: int | None = None
    """Groups submitted per chunk; defaults to ``rollout_batch_size``."""
    rollout_max_response_len: int = 128
    """Maximum new tokens per response."""
    rollout_temperature: float = 1.0
    rollout_top_p: float = 1.0
    rollout_top_k: int = -1
    rollout_stop: list[str] | None = None
    """Stop strings."""
    rollout_stop_token_ids: list[int] | None = None
    """Stop token ids (EOS always stops)."""
    rollout_skip_special_tokens: bool = False
    sglang_enable_deterministic_inference: bool = False
    """``--deterministic``: two runs with the same seed write the same metrics.jsonl. Sample ``i`` of a group
    gets the sampling seed ``rollout_seed + i``; Python's, NumPy's and torch's generators are seeded; torch
    runs its deterministic algorithms; the embedded engine runs one request at a time and launched SGLang
    servers get ``--enable-deterministic-inference``; wall-clock figures go to timings.jsonl. The run warns
    about (and writes to determinism.json) each part that stays non-deterministic, and why."""
    partial_rollout: bool = False
    """Return unfinished groups to the buffer at the end of a step and resume them later."""
    mask_offpolicy_in_partial_rollout: bool = False
    """Loss-mask tokens generated before a partial rollout resumed."""
    rollout_max_groups_per_step: int | None = None
    """Stop pulling data after this many groups in one step (default 8x ``rollout_batch_size``), so a
    filter that drops everything cannot loop forever; the step then returns fewer groups."""
    generate_timeout: float | None = 600.0
    """Seconds one sample's generation may take before it fails as hung; none waits forever."""
    abort_timeout: float = 30.0
    """Seconds to wait for aborted requests to return their partial output at the end of a step."""
    n_samples_per_eval_prompt: int = 1
    eval_temperature: float | None = None
    eval_top_p: float | None = None
    eval_max_response_len: int | None = None
    eval_interval: int | None = None
    """Run eval every this many steps and after the last; none runs no eval during ``rlsdk run``. A training
    run also evaluates before its first step, unless ``skip_eval_before_train``."""
    skip_eval_before_train: bool = False
    """Skip the eval before the first training step (the curve's starting point), as slime's flag."""

    def __post_init__(self) -> None:
        for name in ("rollout_batch_size", "n_samples_per_prompt", "num_rollout"):
            at_least_one(self, name)
        if self.over_sampling_batch_size is not None:
            at_least_one(self, "over_sampling_batch_size")


@dataclass(frozen=True)
class DataOptions:
    """The data: training and eval sets, row keys, chat templates, order."""

    prompt_data: str | None = None
    """Training data: JSONL or Parquet, with an optional ``@[start:end]`` row slice. ``rlsdk run``
    without it uses the shipped single-digit arithmetic set and the demo's settings (``--print-config``
    shows them)."""
    input_key: str = "input"
    """Row key holding the prompt (a string or chat messages)."""
    label_key: str | None = None
    """Row key holding the label."""
    metadata_key: str = "metadata"
    """Row key holding per-row metadata."""
    tool_key: str = "tools"
    """Row key holding tool definitions for the chat template."""
    multimodal_keys: dict[str, str] | None = None
    """Row keys holding each prompt's media, by type (``{"image": "images"}``): the prompt's ``<image>``
    placeholders become those images, in order (slime's ``--multimodal-keys``)."""
    apply_chat_template: bool = False
    """Render prompts through the tokenizer's chat template."""
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra chat-template arguments, such as ``enable_thinking``."""
    rollout_max_prompt_len: int | None = None
    """Drop (and count) prompts longer than this many tokens."""
    rollout_shuffle: bool = False
    """Shuffle the data each epoch with a seed of ``rollout_seed`` and the epoch."""
    rollout_seed: int = 42
    """Seed for shuffling and for deterministic sampling."""
    on_bad_row: str = "error"
    """A malformed data row: ``error`` stops the run naming file and line, ``skip`` counts and goes on."""
    eval_prompt_data: list[str] = field(default_factory=list)
    """Eval datasets as ``name path`` pairs flattened, as slime takes them."""
    eval_datasets: list[dict[str, Any]] = field(default_factory=list)
    """Eval datasets, each ``{"name", "path"}`` and any setting of slime's ``EvalDatasetConfig``
    (``rm_type``, ``n_samples_per_eval_prompt``, ``temperature``, ``max_response_len``, ``input_key``...)
    or ``reward_key``; unset ones are the run's (:mod:`rlsdk.data.eval_sets`)."""
    eval_config: str | None = None
    """slime's multi-task eval file (YAML or JSON): ``eval: {defaults: {...}, datasets: [...]}``, each
    dataset's settings over the defaults over the run's options; replaces ``eval_prompt_data``."""
    custom_config_path: str | None = None
    """slime's custom config: a YAML file whose values are set on ``args`` over every other setting, those
    that are no option too (for custom functions that read them)."""

    def __post_init__(self) -> None:
        one_of(self, "on_bad_row", ("error", "skip"))


EVAL_SET_SETTINGS = (
    "eval_datasets",
    "eval_prompt_data",
    "n_samples_per_eval_prompt",
    "eval_temperature",
    "eval_top_p",
    "eval_max_response_len",
)
"""The settings that choose a run's eval sets and how they are sampled: a resumed run may change them, and
``rlsdk eval --model CHECKPOINT`` takes them from the checkpoint's run unless given."""


@dataclass(frozen=True)
class RewardOptions:
    """Rewards: dict keys, group rewards, invalid rewards, timeouts."""

    group_rm: bool = False
    """Call a dotted-path reward once per group with the list of samples."""
    reward_key: str | None = None
    """Key selecting the training reward from dict rewards."""
    eval_reward_key: str | None = None
    """Key selecting the eval reward from dict rewards; defaults to ``reward_key``."""
    eval_pass_key: str | None = None
    """What decides a pass in an eval's pass@k: a rubric part's name or a dict reward's key (default: the
    full reward)."""
    eval_pass_threshold: float | None = None
    """The value a sample's reward (or its ``eval_pass_key`` part) must reach to pass in pass@k (default: its
    maximum, 1, or for a rubric's full reward its weights summed)."""
    on_invalid_reward: str = "drop_group"
    """What an invalid reward (timeout, crash, wrong type) does: ``fail``, ``drop_group`` or ``score``."""
    invalid_reward_value: float = 0.0
    """The reward given to invalid samples when ``on_invalid_reward`` is ``score``."""
    reward_timeout: float = 60.0
    """Wall-clock seconds one sample's reward (or one group reward) may take before it is marked invalid."""
    constant_reward_steps: int = 10
    """Warn (and repeat it in the run's summary) when every sample got the same reward in this many steps in a
    row: no group then has an advantage, and nothing is learned; 0 turns the check off."""

    def __post_init__(self) -> None:
        one_of(self, "on_invalid_reward", ("fail", "drop_group", "score"))


@dataclass(frozen=True)
class TrainingOptions:
    """The trainer (with ``train``): optimizer, batches, losses, weight sync, asynchronous training, trust checks."""

    train: bool = False
    """Train the policy on every step's kept samples and sync the new weights to the engine."""
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
    loss_type: str = "policy_loss"
    """``policy_loss`` (PPO-style clipped policy gradient), ``sft_loss`` or ``custom_loss``."""
    use_kl_loss: bool = False
    """Add ``kl_loss_coef`` times the KL to the reference model to the loss (loads a reference model)."""
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "k1"
    """KL estimator: ``k1``, ``k2``, ``k3`` or ``low_var_kl`` (k3 clamped to [-10, 10])."""
    kl_coef: float = 0.0
    """KL penalty folded into the reward (reinforce_plus_plus estimators; loads a reference model)."""
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
    ref_load: str | None = None
    """Hugging Face folder of the reference model for KL terms; default the starting policy."""
    weight_sync: str = "auto"
    """How weights reach a GPU engine: ``tensor`` (CUDA IPC, needs ``colocate``), ``nccl`` (a broadcast
    group with the engines), ``disk`` (a Hugging Face folder); ``auto``: in process for the embedded
    engine, else ``tensor`` with ``colocate``, else ``disk``."""
    update_weight_buffer_size: int = UPDATE_WEIGHT_BUFFER_SIZE
    """Bytes of weights a ``tensor`` or ``nccl`` sync sends at a time (slime's name; 512 MiB): the trainer
    gathers and the engines load one bucket of this size after another, never the whole model at once."""
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
    offload: bool = False
    """Both ``offload_train`` and ``offload_rollout`` (slime's ``--offload``)."""
    offload_train: bool | None = None
    """With ``colocate``: the trainer moves its optimizer state and gradients to CPU memory while the engines
    generate, and back before it trains. Default: on with ``colocate`` (as slime)."""
    offload_rollout: bool | None = None
    """With ``colocate``: the engines release their GPU memory (weights, KV cache, CUDA graphs) while the
    trainer trains, and take it back for the weight sync. Default: on with ``colocate`` (as slime)."""
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

    def __post_init__(self) -> None:
        for name, choices in (
            ("loss_type", LOSS_TYPES),
            ("kl_loss_type", KL_LOSS_TYPES),
            ("weight_sync", WEIGHT_SYNC_MODES),
            ("weights_check", WEIGHTS_CHECK_MODES),
            ("update_weight_mode", ("full", "delta")),
            ("update_weight_delta_encoding", ("xor", "overwrite")),
            ("update_weight_delta_checksum", ("xxh3-128", "blake3", "adler32")),
        ):
            one_of(self, name, choices)
        if self.update_weight_mode == "delta" and self.weight_sync not in ("auto", "disk"):
            raise ValueError(
                f"update_weight_mode delta syncs through disk: --update-weight-transport disk, not {self.weight_sync}"
            )
        if self.use_tis and self.use_rollout_logprobs:
            raise ValueError("use_tis and use_rollout_logprobs cannot be set together (as in slime)")
        if self.max_policy_version_lag is not None and self.max_policy_version_lag < 0:
            raise ValueError(f"max_policy_version_lag must be 0 or more, got {self.max_policy_version_lag}")
        if self.update_weight_buffer_size < 1:
            raise ValueError(
                f"update_weight_buffer_size must be at least 1 byte, got {self.update_weight_buffer_size}"
            )
        if self.weight_sync_timeout is not None and not self.weight_sync_timeout > 0:
            raise ValueError(f"weight_sync_timeout must be above 0 seconds, got {self.weight_sync_timeout}")


@dataclass(frozen=True)
class AlgorithmOptions:
    """The algorithm: advantage estimators and their normalization, clipping, SAPO, PPO's critic, LoRA, on-policy distillation."""

    advantage_estimator: str = "grpo"
    """``grpo``, ``gspo``, ``cispo``, ``reinforce_plus_plus``, ``reinforce_plus_plus_baseline``, ``reinforce``,
    ``rloo``, ``sapo`` or ``ppo`` (with a critic; see docs/training.md)."""
    eps_clip: float = 0.2
    """PPO clip range below 1 (and above, unless ``eps_clip_high``)."""
    eps_clip_high: float | None = None
    """PPO clip range above 1 (DAPO's clip-higher); default ``eps_clip``."""
    eps_clip_c: float | None = None
    """Dual-clip PPO's bound (> 1) on the loss of negative-advantage tokens."""
    gamma: float = 1.0
    """Discount of ``reinforce_plus_plus`` returns and of PPO's GAE."""
    disable_grpo_std_normalization: bool = False
    """Dr. GRPO: subtract the group mean reward without dividing by the group's standard deviation."""
    disable_rewards_normalization: bool = False
    """Use raw rewards as advantages (no group mean subtracted)."""
    normalize_advantages: bool = False
    """Whiten advantages over the batch's trained tokens."""
    sapo_tau_pos: float = 1.0
    """SAPO: temperature of the soft gate on tokens with a positive advantage (the paper's 1.0)."""
    sapo_tau_neg: float = 1.05
    """SAPO: temperature of the soft gate on tokens with a negative advantage (the paper's 1.05)."""
    lambd: float = 1.0
    """GAE's lambda (``advantage_estimator: ppo``); ``gamma`` is its discount."""
    value_clip: float = 0.2
    """PPO: the critic's new values stay within this of its old ones in the clipped value loss."""
    critic_lr: float | None = None
    """The critic's AdamW learning rate; default ``lr``."""
    critic_load: str | None = None
    """Hugging Face folder the critic's body starts from; default the policy's model (its value head starts
    at zero)."""
    num_critic_only_steps: int = 0
    """The first this many steps train the critic only (the policy waits for useful values)."""
    lora_rank: int = 0
    """Train a LoRA adapter of this rank instead of the whole model (0: full fine-tuning); only the adapter
    is synced and checkpointed."""
    lora_alpha: float | None = None
    """LoRA's scale numerator (the adapter is scaled by alpha / rank); default twice the rank."""
    lora_target_modules: list[str] | None = None
    """Module names the adapter wraps (``q_proj``, ``v_proj``, ...); default every linear layer but the
    output head (peft's ``all-linear``)."""
    opd_teacher: str | None = None
    """On-policy distillation: the teacher that scores the student's samples, an SGLang-protocol server by
    URL or an engine plugin by name (with ``opd_teacher_load``)."""
    opd_teacher_load: str | None = None
    """The teacher's model (a Hugging Face folder): for a teacher engine given by name, or with ``opd_type
    megatron`` loaded into the trainer beside the policy."""
    use_opd: bool = False
    """On-policy distillation as slime turns it on, with ``opd_type``: ``sglang`` takes each sample's
    ``teacher_log_probs`` as the reward post-process set them (slime's ``on_policy_distillation`` functions,
    the teacher at ``rm_url``); ``megatron`` scores with the teacher loaded into the trainer
    (``opd_teacher_load``). ``opd_teacher`` alone is rlsdk's way: the run asks the teacher engine itself."""
    opd_type: str | None = None
    """``sglang`` or ``megatron``, with ``use_opd`` (slime's ``--opd-type``)."""
    opd_kl_coef: float = 1.0
    """On-policy distillation: subtract this times the reverse KL to the teacher (student minus teacher
    log-prob of each sampled token) from every token's advantage."""

    def __post_init__(self) -> None:
        one_of(self, "advantage_estimator", ADVANTAGE_ESTIMATORS)
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank must be 0 (off) or positive, got {self.lora_rank}")
        if self.lora_rank == 0 and (self.lora_alpha is not None or self.lora_target_modules):
            raise ValueError("lora_alpha and lora_target_modules need lora_rank (a positive adapter rank)")
        if self.advantage_estimator != "ppo" and (self.critic_load or self.critic_lr is not None):
            raise ValueError(
                "critic_load and critic_lr are for advantage_estimator ppo (the one with a critic)"
            )
        if self.num_critic_only_steps < 0 or self.value_clip <= 0:
            raise ValueError("num_critic_only_steps must be at least 0 and value_clip above 0")
        check_opd(self)
        if min(self.sapo_tau_pos, self.sapo_tau_neg) <= 0:
            raise ValueError("sapo_tau_pos and sapo_tau_neg must be above 0")


def check_opd(args: AlgorithmOptions) -> None:
    """slime's rules for ``use_opd``, ``opd_type`` and ``opd_teacher_load``, beside rlsdk's ``opd_teacher``."""
    if args.opd_type is not None and args.opd_type not in OPD_TYPES:
        raise ValueError(f"opd_type must be one of {', '.join(OPD_TYPES)}, got {args.opd_type!r}")
    if args.use_opd and args.opd_type is None:
        raise ValueError(
            "--opd-type must be specified when --use-opd is enabled. Choose 'sglang' or 'megatron'."
        )
    if args.opd_type is not None and not args.use_opd:
        raise ValueError("--opd-type is set but --use-opd is not enabled. Please add --use-opd flag.")
    if args.use_opd and args.opd_teacher:
        raise ValueError("--use-opd (slime's) and --opd-teacher (rlsdk's) name two teachers: give one")
    if args.opd_type == "megatron" and not args.opd_teacher_load:
        raise ValueError(
            "--opd-teacher-load is required when --opd-type=megatron (the teacher's model folder)"
        )
    if args.opd_type == "sglang" and args.opd_teacher_load:
        raise ValueError(
            "--opd-teacher-load should not be set when --opd-type=sglang: the teacher's log-probs come from its "
            "server during the rollout"
        )
    if args.opd_teacher_load and not (args.opd_teacher or args.opd_type == "megatron"):
        raise ValueError(
            "opd_teacher_load names the teacher's model: give the teacher engine (opd_teacher), or "
            "--use-opd --opd-type megatron"
        )


@dataclass(frozen=True)
class EngineOptions:
    """The engines: the model, SGLang servers (given or launched on GPUs), Ray."""

    model: str | None = None
    """Model for the embedded engine: a local Hugging Face folder; default SmolLM2-135M-Instruct."""
    hf_checkpoint: str | None = None
    """Tokenizer/model folder used for chat templates when it differs from ``model``."""
    sglang_router_ip: str | None = None
    """Host of the engine's HTTP endpoint in use (set by the engine when a run starts)."""
    sglang_router_port: int | None = None
    """Port of the engine's HTTP endpoint in use (set by the engine when a run starts)."""
    sglang_server_concurrency: int = 512
    """Requests in flight at once per engine."""
    sglang_url: str | None = None
    """URL of the SGLang server or router for the ``sglang`` engine; default from ``sglang_router_ip``/``_port``;
    with neither, the engine launches SGLang on this machine's GPUs (``rollout_num_gpus``, ``colocate``)."""
    sglang_launch: bool = False
    """Launch SGLang even though ``sglang_router_ip``/``_port`` are set (they then name the router's address)."""
    sglang_python: str | None = None
    """Python interpreter with SGLang installed, used for launched servers; default this one."""
    sglang_retries: int = 5
    """Times the ``sglang`` engine retries a request on connection errors and HTTP 5xx (never on 4xx), with
    exponential backoff; then the sample fails with the reason and its prompt is served again later."""
    sglang_backoff: float = 0.25
    """Base seconds of the ``sglang`` engine's exponential backoff (full jitter, at most 10 s a wait)."""
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
    ray_address: str | None = None
    """Run on Ray: ``local`` starts a cluster on this machine (dashboard off), ``auto`` or ``ray://host:port``
    joins a running one; engines run as actors, CPU-heavy grading as tasks. None: no Ray."""
    num_engines: int = 1
    """Engine actors on Ray; requests go to the least-loaded one, a dead one is restarted."""
    ray_runtime_env: dict[str, Any] | None = None
    """Ray runtime environment for the workers (``env_vars``, ``pip``, ``working_dir``...), as Ray takes it
    (``--runtime-env`` JSON)."""
    ray_engine_cpus: float = 1.0
    """Logical CPUs each engine actor asks Ray for."""
    ray_spare_engines: int = 0
    """Engine actors kept started beside the serving ones, each ready to take a dead engine's place at once
    (it then takes the current weights and the trust check); each costs an engine's CPUs and memory."""
    ray_sync_rewards: bool = False
    """Plain (sync, not ``cheap``) rewards run as Ray tasks across the cluster, one CPU each, instead of in
    the driver's threads: each task resolves the reward from its node's environment (a path must name the
    same file there), and a task whose worker dies runs again elsewhere. For CPU-heavy rewards."""
    ray_standby_engines: int | None = None
    """Engine actors kept prepared beside the serving ones (process up, the engine's imports done, no model
    loaded), each ready to start in a dead engine's place: a restart then only loads the model and the
    weights. Each asks Ray for an engine's resources and holds a process's imports in memory (0: none).
    Default one, but none for SGLang engines on GPUs: a standby holds its GPUs idle, so ask for one only
    with GPUs to spare (more engine actors than the cluster has GPUs for is an error before the start)."""
    ray_start_timeout: float = 300.0
    """Seconds an actor may take to be placed, start and load its model before the run stops naming its
    node, device, port and log file."""
    rollout_health_check_timeout: float = 30.0
    """Seconds an engine on Ray may take to answer a health check (checked every second) before it is taken
    for hung and replaced, as slime's flag; one that answers requests meanwhile is busy, not hung."""
    ray_call_timeout: float = 120.0
    """Seconds an engine actor on Ray may take to answer a call other than a generation (each sample has
    ``generate_timeout``), a weight load (``weight_sync_timeout``) and its start (``ray_start_timeout``):
    pause, resume, abort, its load, a cache flush, what it serves, its weight checksums. One that does not
    answer is taken for hung and replaced, as one silent to its health check is."""
    ray_trainer_timeout: float = 1800.0
    """Seconds one call of the trainer actor on Ray may take (a train step, log-probs, its weights for a
    sync, a checkpoint's save or load) before the run stops naming the call, the actor and how to resume:
    the trainer is taken for hung and its actor stopped. The default is torch.distributed's collective
    timeout, past which a multi-GPU trainer's step fails anyway; raise it for steps or checkpoints that take
    longer."""

    def __post_init__(self) -> None:
        for name in ("sglang_server_concurrency", "num_engines"):
            at_least_one(self, name)
        for name in ("ray_call_timeout", "ray_trainer_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be above 0 seconds, got {getattr(self, name)}")
        if self.num_engines > 1 and not self.ray_address:
            raise ValueError(
                f"num_engines {self.num_engines} needs ray_address (--ray): engines are Ray actors"
            )


@dataclass(frozen=True)
class MegatronOptions:
    """Model parallelism (slime's names; the ``megatron`` trainer reads them)."""

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


@dataclass(frozen=True)
class AgentsOptions:
    """Multi-turn generators and agents."""

    rollout_max_context_len: int | None = None
    """Prompt plus response tokens allowed per sample; multi-turn generators clamp each turn to it."""
    max_turns: int = 4
    """Model turns per sample for multi-turn generators and agents (``multi_turn``, ``search_r1``,
    ``tool_agent``, and third-party ones that read it)."""


@dataclass(frozen=True)
class OutputOptions:
    """The run's folder: outputs, resume, checkpoints, reports, failed steps."""

    output_dir: str = "rlsdk-out"
    """Folder for rollouts.jsonl, metrics.jsonl and the resume state."""
    resume: bool = False
    """Continue from the state saved in ``output_dir``."""
    overwrite: bool = False
    """Start afresh in an ``output_dir`` that holds a run (otherwise that is an error)."""
    on_failed_step: str = "fail"
    """A training step whose every sample failed: ``fail`` stops the run with the causes (a non-zero exit),
    ``continue`` goes on to the next step."""
    save: str | None = None
    """Folder for checkpoints (``step_N/``); default ``<output_dir>/checkpoints`` when ``save_interval`` is set."""
    save_interval: int | None = None
    """Save a checkpoint every this many steps (and after the last)."""
    keep_last_n: int | None = None
    """Keep only the newest this many checkpoints, removing older ones as new ones are written (verl's
    ``max_actor_ckpt_to_keep``, Hugging Face's ``save_total_limit``); none keeps every one."""
    report_to: str | None = None
    """``tensorboard``: also write TensorBoard event files to ``<output_dir>/tensorboard``."""
    log_timeout: float | None = 600.0
    """Seconds one rollout_log or eval_rollout_log backend may take for one step or eval before the run stops
    naming it; none waits forever. A stop signal (SIGTERM, SIGINT) ends the wait at once either way."""

    def __post_init__(self) -> None:
        one_of(self, "on_failed_step", ("fail", "continue"))
        if self.keep_last_n is not None and self.keep_last_n < 1:
            raise ValueError(
                f"keep_last_n must be at least 1 (the checkpoint --resume needs), got {self.keep_last_n}"
            )


SECTIONS: dict[str, type] = {
    "rollout": RolloutOptions,
    "data": DataOptions,
    "reward": RewardOptions,
    "training": TrainingOptions,
    "algorithm": AlgorithmOptions,
    "engine": EngineOptions,
    "megatron": MegatronOptions,
    "agents": AgentsOptions,
    "output": OutputOptions,
}
"""Section name -> its class: ``config.<name>`` is that section of a configuration."""


@dataclass(frozen=True)
class RunSections:
    """A configuration's sections, each a frozen dataclass."""

    rollout: RolloutOptions
    data: DataOptions
    reward: RewardOptions
    training: TrainingOptions
    algorithm: AlgorithmOptions
    engine: EngineOptions
    megatron: MegatronOptions
    agents: AgentsOptions
    output: OutputOptions


@dataclass(frozen=True)
class RunOptions(
    OutputOptions,
    AgentsOptions,
    MegatronOptions,
    EngineOptions,
    AlgorithmOptions,
    TrainingOptions,
    RewardOptions,
    DataOptions,
    RolloutOptions,
):
    """Every section's options under slime's flat names, and the plugins' choices and options: a run's
    options as plain values (:class:`rlsdk.RolloutConfig` builds and checks them)."""

    choices: dict[str, Any] = field(default_factory=dict)
    """The plugin each kind's options name for this run, by option (every kind's option, its default when
    not given)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """The plugins' options given for this run (and slime's arguments that rlsdk has no option for)."""

    @functools.cached_property
    def sections(self) -> RunSections:
        """The options by section: ``args.sections.training.lr``."""
        return RunSections(
            **{
                name: section(**{f.name: getattr(self, f.name) for f in dataclasses.fields(section)})
                for name, section in SECTIONS.items()
            }
        )
