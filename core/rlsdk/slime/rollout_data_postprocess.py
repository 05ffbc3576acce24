"""Installed ``rollout_data_postprocess`` plugins as slime functions: ``rlsdk.slime.rollout_data_postprocess.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("rollout_data_postprocess")
