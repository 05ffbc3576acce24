"""Installed ``reward_post_process`` plugins as slime functions: ``rlsdk.slime.reward_post_process.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("reward_post_process")
