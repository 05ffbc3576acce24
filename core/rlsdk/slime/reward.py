"""Installed ``reward`` plugins as slime functions: ``rlsdk.slime.reward.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("reward")
