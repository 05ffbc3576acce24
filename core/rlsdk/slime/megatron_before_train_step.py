"""Installed ``megatron_before_train_step`` plugins as slime functions: ``rlsdk.slime.megatron_before_train_step.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("megatron_before_train_step")
