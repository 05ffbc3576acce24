"""Installed ``megatron_init`` plugins as slime functions: ``rlsdk.slime.megatron_init.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("megatron_init")
