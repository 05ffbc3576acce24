"""Installed ``advantage`` plugins as slime functions: ``rlsdk.slime.advantage.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("advantage")
