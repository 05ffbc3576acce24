"""Installed ``rollout_sample_filter`` plugins as slime functions: ``rlsdk.slime.rollout_sample_filter.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("rollout_sample_filter")
