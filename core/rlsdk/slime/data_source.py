"""Installed ``data_source`` plugins as slime functions: ``rlsdk.slime.data_source.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("data_source")
