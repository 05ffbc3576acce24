"""Installed ``megatron_before_log_prob`` plugins as slime functions: ``rlsdk.slime.megatron_before_log_prob.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("megatron_before_log_prob")
