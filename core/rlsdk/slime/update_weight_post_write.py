"""Installed ``update_weight_post_write`` plugins as slime functions: ``rlsdk.slime.update_weight_post_write.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("update_weight_post_write")
