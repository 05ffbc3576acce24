"""rlsdk: the plugin SDK for LLM reinforcement learning.

This module is the public API: every name a plugin author or a script needs is importable from ``rlsdk``
(and the test kit from ``rlsdk.testing``). Everything else (``rlsdk.rollout``, ``rlsdk.run``,
``rlsdk.training``, ...) is internal and may change in any release. The public names follow semantic
versioning: a name that moves or changes keeps working for at least one minor version with a
``DeprecationWarning`` naming its replacement (``scripts/api_check.py`` checks it with griffe against the
released baseline ``api/rlsdk.json``).

Names whose modules import torch (the trainer protocol and the loss helpers) load on first use, so
``import rlsdk`` stays fast where torch is absent.
"""

from typing import TYPE_CHECKING

from . import _moved
from ._lazy import lazy_module_hooks
from ._version import __version__ as __version__
from .agents.tool_parsers import FunctionCall, ParsedTurn
from .aio.backoff import backoff_delay
from .aio.task_pools import TaskPool, cluster_task_pool
from .answers import boxed_contents
from .config import RolloutConfig
from .data.source import START_ROLLOUT_ID, DataSource
from .engines.protocol import BUFFER_TOKEN_ENV
from .errors import (
    DataError,
    PluginCallError,
    PluginConflictError,
    PluginError,
    RlsdkError,
    UnknownPluginError,
)
from .plugins.hookspecs import hookimpl, hookspec
from .plugins.loading import load_callable, package_file
from .plugins.manager import RlsdkPluginManager, get_plugin_manager
from .plugins import kinds as _kinds
from .plugins.kinds import *  # noqa: F403 (every kind's record: rlsdk.Reward, rlsdk.SampleHook, ...)
from .plugins.kinds import KINDS
from .plugins.records import Option, PluginInfo, Resolved
from .rollout.generate import append_observation, model_turn
from .rollout.generate import generate as single_turn
from .rollout.rewarding import REWARD_ERROR, score_samples
from .rollout.tools import ToolResult, call_tool, resolve_tools
from .runtime import Runtime, get_runtime
from .types import (
    DynamicFilterOutput,
    Messages,
    RolloutFnEvalOutput,
    RolloutFnTrainOutput,
    Sample,
    reward_value,
)

if TYPE_CHECKING:
    from .rollout.step import generate_rollout as sglang_rollout
    from .run.job import run_job
    from .training.losses import log_probs_and_entropy, response_logits, sum_of_sample_mean_fn

_LAZY = {
    "run_job": "rlsdk.run.job",
    "sglang_rollout": "rlsdk.rollout.step:generate_rollout",
    "log_probs_and_entropy": "rlsdk.training.losses",
    "response_logits": "rlsdk.training.losses",
    "sum_of_sample_mean_fn": "rlsdk.training.losses",
}
"""Public names whose modules import torch (or aiohttp): loaded on first access."""
MOVED = {
    **dict.fromkeys(
        [
            "InferenceEngine",
            "SGLangClient",
            "EngineError",
            "EngineRequestError",
            "EngineResponseError",
            "EngineUnavailableError",
            "finish_abort",
            "finish_length",
            "finish_stop",
            "generate_response",
            "split_batch",
            "new_rid",
            "tensor_checksum",
            "ServedChecksums",
            "read_lora_adapter",
            "lora_adapter_deltas",
        ],
        "rlsdk.engine_api",
    ),
    **dict.fromkeys(
        [
            "PolicyTrainer",
            "TorchTrainer",
            "LoraAdapter",
            "TrainSample",
            "byte_buckets",
            "adamw",
            "OPTIMIZER_FILE",
            "resolve_loss",
            "MegatronHooks",
            "trainer_world_size",
            "named_model_folder",
            "ManagedProcess",
            "free_port",
        ],
        "rlsdk.trainer_api",
    ),
}
"""Names of 0.2's ``rlsdk`` that engine and trainer implementers alone use: they moved to their audience's
namespace and forward from here with a ``DeprecationWarning`` until 0.4."""

__getattr__, __dir__ = lazy_module_hooks(globals(), _LAZY, MOVED)


_moved.install()

__all__ = [
    "BUFFER_TOKEN_ENV",
    "KINDS",
    "REWARD_ERROR",
    "START_ROLLOUT_ID",
    "DataError",
    "DataSource",
    "DynamicFilterOutput",
    "FunctionCall",
    "Messages",
    "Option",
    "ParsedTurn",
    "PluginCallError",
    "PluginConflictError",
    "PluginError",
    "PluginInfo",
    "Resolved",
    "RlsdkError",
    "RlsdkPluginManager",
    "RolloutConfig",
    "RolloutFnEvalOutput",
    "RolloutFnTrainOutput",
    "Runtime",
    "Sample",
    "TaskPool",
    "ToolResult",
    "UnknownPluginError",
    "append_observation",
    "backoff_delay",
    "boxed_contents",
    "call_tool",
    "cluster_task_pool",
    "get_plugin_manager",
    "get_runtime",
    "hookimpl",
    "hookspec",
    "load_callable",
    "log_probs_and_entropy",
    "model_turn",
    "package_file",
    "resolve_tools",
    "response_logits",
    "reward_value",
    "run_job",
    "sglang_rollout",
    "score_samples",
    "single_turn",
    "sum_of_sample_mean_fn",
    *_kinds.__all__,
]
