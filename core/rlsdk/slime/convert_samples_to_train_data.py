"""Installed ``convert_samples_to_train_data`` plugins as slime functions: ``rlsdk.slime.convert_samples_to_train_data.<name>``."""

from .adapters import kind_module_hooks

__getattr__, __dir__ = kind_module_hooks("convert_samples_to_train_data")
