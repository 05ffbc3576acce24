"""slime's modules without slime: the stand-in modules (``utils_types``, ``sglang_rollout``, ...) that
``import slime.X`` gives while no real slime is importable. The import finder that maps slime's names to
them is :mod:`rlsdk.plugins.slime_layer` (plugin loading turns it on)."""

from ..plugins.slime_layer import ENV_SWITCH, MODULES, install, installed, real_slime_importable, uninstall

__all__ = ["ENV_SWITCH", "MODULES", "install", "installed", "real_slime_importable", "uninstall"]
