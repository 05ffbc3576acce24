"""rlsdk: the plugin SDK for LLM reinforcement-learning rollouts."""

from importlib.metadata import PackageNotFoundError, version

from .config import RolloutConfig
from .errors import PluginCallError, PluginConflictError, PluginError, RlsdkError, UnknownPluginError
from .plugins.hookspecs import hookimpl, hookspec
from .plugins.manager import RlsdkPluginManager, get_plugin_manager
from .plugins.records import (
    KINDS,
    Agent,
    BufferFilter,
    CustomGenerate,
    DynamicFilter,
    Engine,
    GenerateRollout,
    Loss,
    Option,
    OverSamplingFilter,
    PluginInfo,
    Resolved,
    Reward,
    TaskGenerator,
    Tool,
    ToolCallParser,
    Trainer,
)
from .types import DynamicFilterOutput, RolloutFnEvalOutput, RolloutFnTrainOutput, Sample

try:
    __version__ = version("rlsdk")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "KINDS",
    "Agent",
    "BufferFilter",
    "CustomGenerate",
    "DynamicFilter",
    "DynamicFilterOutput",
    "Engine",
    "GenerateRollout",
    "Loss",
    "Option",
    "OverSamplingFilter",
    "PluginCallError",
    "PluginConflictError",
    "PluginError",
    "PluginInfo",
    "Resolved",
    "Reward",
    "RlsdkError",
    "RlsdkPluginManager",
    "RolloutConfig",
    "RolloutFnEvalOutput",
    "RolloutFnTrainOutput",
    "Sample",
    "TaskGenerator",
    "Tool",
    "ToolCallParser",
    "Trainer",
    "UnknownPluginError",
    "get_plugin_manager",
    "hookimpl",
    "hookspec",
]
