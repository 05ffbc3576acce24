"""Options of the algorithms beyond the clipped policy gradient: SAPO's gates, PPO's critic and GAE, LoRA
adapters and on-policy distillation. slime's names where slime has the option (``--value-clip``,
``--lambd``, ``--critic-lr``, ``--critic-load``, ``--num-critic-only-steps``, ``--opd-kl-coef``,
``--opd-teacher-load``); :class:`~rlsdk.training_options.TrainingOptions` inherits them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AlgorithmOptions:
    """SAPO, PPO's critic, LoRA and on-policy distillation (used with ``train``)."""

    # --- SAPO ---
    sapo_tau_pos: float = 1.0
    """SAPO: temperature of the soft gate on tokens with a positive advantage (the paper's 1.0)."""
    sapo_tau_neg: float = 1.05
    """SAPO: temperature of the soft gate on tokens with a negative advantage (the paper's 1.05)."""

    # --- PPO with a critic (advantage_estimator: ppo) ---
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

    # --- LoRA ---
    lora_rank: int = 0
    """Train a LoRA adapter of this rank instead of the whole model (0: full fine-tuning); only the adapter
    is synced and checkpointed."""
    lora_alpha: float | None = None
    """LoRA's scale numerator (the adapter is scaled by alpha / rank); default twice the rank."""
    lora_target_modules: list[str] | None = None
    """Module names the adapter wraps (``q_proj``, ``v_proj``, ...); default every linear layer but the
    output head (peft's ``all-linear``)."""

    # --- on-policy distillation ---
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


OPD_TYPES = ("sglang", "megatron")


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


def check_algorithm_options(args: AlgorithmOptions, advantage_estimator: str) -> None:
    """ValueError for settings that cannot work together."""
    if args.lora_rank < 0:
        raise ValueError(f"lora_rank must be 0 (off) or positive, got {args.lora_rank}")
    if args.lora_rank == 0 and (args.lora_alpha is not None or args.lora_target_modules):
        raise ValueError("lora_alpha and lora_target_modules need lora_rank (a positive adapter rank)")
    if advantage_estimator != "ppo" and (args.critic_load or args.critic_lr is not None):
        raise ValueError("critic_load and critic_lr are for advantage_estimator ppo (the one with a critic)")
    if args.num_critic_only_steps < 0 or args.value_clip <= 0:
        raise ValueError("num_critic_only_steps must be at least 0 and value_clip above 0")
    check_opd(args)
    if min(args.sapo_tau_pos, args.sapo_tau_neg) <= 0:
        raise ValueError("sapo_tau_pos and sapo_tau_neg must be above 0")
