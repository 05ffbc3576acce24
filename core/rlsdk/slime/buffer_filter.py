"""Installed ``buffer_filter`` plugins as slime functions: ``rlsdk.slime.buffer_filter.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("buffer_filter")
