"""Installed ``pg_loss_reducer`` plugins as slime functions: ``rlsdk.slime.pg_loss_reducer.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("pg_loss_reducer")
