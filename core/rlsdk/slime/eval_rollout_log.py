"""Installed ``eval_rollout_log`` plugins as slime functions: ``rlsdk.slime.eval_rollout_log.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("eval_rollout_log")
