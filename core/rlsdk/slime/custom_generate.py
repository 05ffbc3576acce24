"""Installed ``custom_generate`` plugins as slime functions: ``rlsdk.slime.custom_generate.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("custom_generate")
