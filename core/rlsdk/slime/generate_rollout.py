"""Installed ``generate_rollout`` plugins as slime functions: ``rlsdk.slime.generate_rollout.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("generate_rollout")
