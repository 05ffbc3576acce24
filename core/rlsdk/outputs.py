"""Names of the files in a run's output folder that more than one part of rlsdk reads."""

STATE_FILE = "state.json"
"""The run state ``--resume`` continues from: next step, output file sizes, data position, settings, the
last checkpoint (relative to the output folder)."""
ROLLOUTS_FILE = "rollouts.jsonl"
"""Each kept sample, a line each, with the step (``rollout_id``) it was trained in."""
DISCARDED_FILE = "discarded.jsonl"
"""Each dropped or failed sample, with its ``metadata["drop_reason"]`` or error."""
METRICS_FILE = "metrics.jsonl"
"""One row of metrics per step."""
TIMINGS_FILE = "timings.jsonl"
"""Deterministic mode (``--deterministic``): each step's and eval's wall-clock figures (:func:`is_timing`),
which ``metrics.jsonl`` and ``eval.jsonl`` then leave out."""
EVAL_FILE = "eval.jsonl"
"""One row of eval metrics per eval."""
EVAL_SAMPLES_FILE = "eval_samples.jsonl"
"""Each eval sample, with its ``dataset``."""
LOCK_FILE = ".rlsdk.lock"
"""Held (``flock``) by the run using the folder; holds its pid."""
TRAIN_LOG_PROBS = "train_log_probs"
"""Sample metadata key: the trainer's log-probs of the response tokens under the policy that sampled them
(before the step's update), where the trainer computes them, beside the engine's ``rollout_log_probs``."""


TIMING_SUFFIXES = ("seconds", "_time", "_per_s", "memory_gb")
"""How the names of wall-clock and memory figures end (``train/seconds``, ``rollout/tokens_per_s``,
``rollout/rollout_time``, ``train/peak_memory_gb``): they differ between two runs with the same seeds."""
MEMORY_PREFIX = "memory/"
"""The GPU memory figures of a colocated run (``memory/peak_gpu_gb_train``): the allocator's, not the seeds'
(two deterministic runs on one H200 differed there by 0.04 GB, 2026-11-29)."""


def is_timing(key: str) -> bool:
    """Whether the metric ``key`` is a wall-clock or memory figure (:data:`TIMING_SUFFIXES`,
    :data:`MEMORY_PREFIX`)."""
    return key.endswith(TIMING_SUFFIXES) or key.startswith(MEMORY_PREFIX)
