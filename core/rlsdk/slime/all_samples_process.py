"""Installed ``all_samples_process`` plugins as slime functions: ``rlsdk.slime.all_samples_process.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("all_samples_process")
