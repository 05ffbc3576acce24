"""Installed ``tis_function`` plugins as slime functions: ``rlsdk.slime.tis_function.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("tis_function")
