"""rlsdk: the plugin SDK for LLM reinforcement learning.

This module is the public API: every name a plugin author or a script needs is importable from ``rlsdk``
(and the test kit from ``rlsdk.testing``). Everything else (``rlsdk.rollout``, ``rlsdk.run``,
``rlsdk.training``, ...) is internal and may change in any release. The public names follow semantic
versioning: a name that moves or changes keeps working for at least one minor version with a
``DeprecationWarning`` naming its replacement (``api/rlsdk.txt`` is the committed snapshot CI checks).

Names whose modules import torch (the trainer protocol and the loss helpers) load on first use, so
``import rlsdk`` stays fast where torch is absent.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from . import _moved
from ._version import __version__ as __version__
from .agents.tool_parsers import FunctionCall, ParsedTurn
from .aio.backoff import backoff_delay
from .aio.task_pools import TaskPool, cluster_task_pool
from .answers import boxed_contents
from .config import RolloutConfig
from .data.source import START_ROLLOUT_ID, DataSource
from .engines.engine import InferenceEngine
from .engines.launch.process_group import ManagedProcess, free_port
from .engines.lora_adapter import lora_adapter_deltas, read_lora_adapter
from .engines.weight_checksums import ServedChecksums, tensor_checksum
from .engines.protocol import (
    BUFFER_TOKEN_ENV,
    EngineError,
    EngineRequestError,
    EngineResponseError,
    EngineUnavailableError,
    finish_abort,
    finish_length,
    finish_stop,
    generate_response,
    new_rid,
    split_batch,
)
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
from .plugins.records import (
    KINDS,
    Advantage,
    Agent,
    AllSamplesProcess,
    BufferFilter,
    CheckpointCallback,
    ConvertSamplesToTrainData,
    CustomGenerate,
    DataSourceFactory,
    DynamicFilter,
    Engine,
    Environment,
    EvalRolloutLog,
    GenerateRollout,
    Loss,
    MegatronBeforeLogProb,
    MegatronBeforeTrainStep,
    MegatronInit,
    ModelProvider,
    Option,
    OverSamplingFilter,
    PgLossReducer,
    PluginInfo,
    Resolved,
    Reward,
    RewardPostProcess,
    RolloutDataPostprocess,
    RolloutLog,
    RolloutSampleFilter,
    SampleHook,
    TaskGenerator,
    TisFunction,
    Tool,
    ToolCallParser,
    Trainer,
    UpdateWeightPostWrite,
)
from .rollout.generate import append_observation, model_turn
from .rollout.generate import generate as single_turn
from .rollout.rewarding import REWARD_ERROR, score_samples
from .rollout.tools import ToolResult, call_tool, resolve_tools
from .runtime import Runtime, get_runtime
from .training.megatron_hooks import MegatronHooks
from .training_options import named_model_folder, trainer_world_size
from .types import (
    DynamicFilterOutput,
    Messages,
    RolloutFnEvalOutput,
    RolloutFnTrainOutput,
    Sample,
    reward_value,
)

if TYPE_CHECKING:
    from .engines.sglang_client import SGLangClient
    from .training.batch import TrainSample
    from .training.losses import log_probs_and_entropy, response_logits, sum_of_sample_mean_fn
    from .training.torch_trainer import OPTIMIZER_FILE, TorchTrainer, adamw, resolve_loss
    from .training.trainer import LoraAdapter, PolicyTrainer, byte_buckets

_LAZY = {
    "SGLangClient": "rlsdk.engines.sglang_client",
    "PolicyTrainer": "rlsdk.training.trainer",
    "LoraAdapter": "rlsdk.training.trainer",
    "byte_buckets": "rlsdk.training.trainer",
    "TrainSample": "rlsdk.training.batch",
    "TorchTrainer": "rlsdk.training.torch_trainer",
    "OPTIMIZER_FILE": "rlsdk.training.torch_trainer",
    "adamw": "rlsdk.training.torch_trainer",
    "resolve_loss": "rlsdk.training.torch_trainer",
    "log_probs_and_entropy": "rlsdk.training.losses",
    "response_logits": "rlsdk.training.losses",
    "sum_of_sample_mean_fn": "rlsdk.training.losses",
}
"""Public names whose modules import torch (or aiohttp, the client's): loaded on first access."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlsdk' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


_moved.install()

__all__ = [
    "BUFFER_TOKEN_ENV",
    "KINDS",
    "OPTIMIZER_FILE",
    "REWARD_ERROR",
    "START_ROLLOUT_ID",
    "Advantage",
    "Agent",
    "AllSamplesProcess",
    "BufferFilter",
    "CheckpointCallback",
    "ConvertSamplesToTrainData",
    "CustomGenerate",
    "DataError",
    "DataSource",
    "DataSourceFactory",
    "DynamicFilter",
    "DynamicFilterOutput",
    "Engine",
    "EngineError",
    "EngineRequestError",
    "EngineResponseError",
    "EngineUnavailableError",
    "Environment",
    "EvalRolloutLog",
    "FunctionCall",
    "GenerateRollout",
    "InferenceEngine",
    "LoraAdapter",
    "Loss",
    "ManagedProcess",
    "MegatronBeforeLogProb",
    "MegatronBeforeTrainStep",
    "MegatronHooks",
    "MegatronInit",
    "Messages",
    "ModelProvider",
    "Option",
    "OverSamplingFilter",
    "ParsedTurn",
    "PgLossReducer",
    "PluginCallError",
    "PluginConflictError",
    "PluginError",
    "PluginInfo",
    "PolicyTrainer",
    "Resolved",
    "Reward",
    "RewardPostProcess",
    "RlsdkError",
    "RlsdkPluginManager",
    "RolloutConfig",
    "RolloutDataPostprocess",
    "RolloutFnEvalOutput",
    "RolloutFnTrainOutput",
    "RolloutLog",
    "RolloutSampleFilter",
    "Runtime",
    "SGLangClient",
    "Sample",
    "SampleHook",
    "ServedChecksums",
    "TaskGenerator",
    "TaskPool",
    "TisFunction",
    "Tool",
    "ToolCallParser",
    "ToolResult",
    "TorchTrainer",
    "TrainSample",
    "Trainer",
    "UnknownPluginError",
    "UpdateWeightPostWrite",
    "adamw",
    "append_observation",
    "backoff_delay",
    "boxed_contents",
    "byte_buckets",
    "call_tool",
    "cluster_task_pool",
    "finish_abort",
    "finish_length",
    "finish_stop",
    "free_port",
    "generate_response",
    "get_plugin_manager",
    "get_runtime",
    "hookimpl",
    "hookspec",
    "load_callable",
    "log_probs_and_entropy",
    "lora_adapter_deltas",
    "model_turn",
    "named_model_folder",
    "new_rid",
    "package_file",
    "read_lora_adapter",
    "resolve_loss",
    "resolve_tools",
    "response_logits",
    "reward_value",
    "score_samples",
    "single_turn",
    "split_batch",
    "sum_of_sample_mean_fn",
    "tensor_checksum",
    "trainer_world_size",
]
