"""Installed ``rollout_log`` plugins as slime functions: ``rlsdk.slime.rollout_log.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("rollout_log")
