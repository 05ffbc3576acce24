"""Installed ``sample_hook`` plugins as slime functions: ``rlsdk.slime.sample_hook.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("sample_hook")
