"""Which run options each command uses: ``rlsdk eval`` refuses (and hides from its help) what only training or
a run's steps read, and ``rlsdk run`` without ``--train`` refuses a training option given on its command line, so
that no flag is taken and then ignored. A config file may hold options a command does not use (one file
serves ``run`` and ``eval``); the command line may not."""

from __future__ import annotations

import dataclasses

from rlsdk.options import SECTIONS
from rlsdk.plugins.kinds import RECORD_TYPES

TRAINING_KINDS = (
    "trainer",
    "loss",
    "advantage",
    "reward_post_process",
    "rollout_data_postprocess",
    "convert_samples_to_train_data",
    "checkpoint_callback",
    "pg_loss_reducer",
    "tis_function",
    "megatron_init",
    "megatron_before_log_prob",
    "megatron_before_train_step",
    "model_provider",
    "update_weight_post_write",
)
"""The kinds only training calls (the trainer, its losses and estimators, checkpoints and weight syncs)."""
STEP_KINDS = (
    "dynamic_filter",
    "over_sampling_filter",
    "buffer_filter",
    "rollout_sample_filter",
    "all_samples_process",
    "rollout_metrics",
    "rollout_log",
    "data_source",
)
"""The kinds only a run's rollout steps call: an eval scores every sample of its datasets, unfiltered."""


def _section(name: str) -> set[str]:
    return {f.name for f in dataclasses.fields(SECTIONS[name])}


def _kind_options(kinds: tuple[str, ...]) -> set[str]:
    return {option.name for kind in kinds for option in RECORD_TYPES[kind].options}


TRAINING_ONLY = frozenset(
    (_section("training") | _section("algorithm") | _section("megatron") | _kind_options(TRAINING_KINDS))
    - {"train"}
    | {"save", "save_interval", "keep_last_n", "report_to", "skip_eval_before_train"}
)
"""Options only ``--train`` reads: the training, algorithm and megatron sections, the training kinds'
options, and the checkpoints' and the report's."""
STEP_ONLY = frozenset(
    {
        "num_rollout",
        "rollout_batch_size",
        "n_samples_per_prompt",
        "over_sampling_batch_size",
        "partial_rollout",
        "mask_offpolicy_in_partial_rollout",
        "rollout_max_groups_per_step",
        "eval_interval",
        "on_failed_step",
    }
    | _kind_options(STEP_KINDS)
)
"""Options only a run's rollout steps read (their size, their filters and loggers, the data source)."""
EVAL_UNUSED = TRAINING_ONLY | STEP_ONLY | {"train"}
"""The run options ``rlsdk eval`` refuses: it generates and scores its datasets once."""


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def eval_refusals(names: set[str]) -> list[str]:
    """Of the options the command line gives ``rlsdk eval`` (flags and ``--set``), those it does not use, as
    messages."""
    return [
        f"rlsdk eval does not use {flag(name)} (rlsdk run's, for its {'training' if name in TRAINING_ONLY | {'train'} else 'steps'})"
        for name in sorted(names & EVAL_UNUSED)
    ]


def without_train_refusals(names: set[str]) -> list[str]:
    """Of the options the command line gives ``rlsdk run`` without ``--train``, those only training reads."""
    return [
        f"{flag(name)} applies only with --train: add --train, or leave it out"
        for name in sorted(names & TRAINING_ONLY)
    ]
