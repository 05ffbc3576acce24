"""Installed ``over_sampling_filter`` plugins as slime functions: ``rlsdk.slime.over_sampling_filter.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("over_sampling_filter")
