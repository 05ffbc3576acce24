"""Installed ``model_provider`` plugins as slime functions: ``rlsdk.slime.model_provider.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("model_provider")
