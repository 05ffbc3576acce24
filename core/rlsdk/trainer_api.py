"""The public API for trainer implementers: what a ``trainer`` plugin (a :class:`PolicyTrainer`) builds on.
Plugin authors of the other kinds need none of it (:mod:`rlsdk`; a loss's helpers are there).

- :class:`PolicyTrainer`, the protocol, and :class:`LoraAdapter`, what it hands a LoRA-serving engine;
  :func:`byte_buckets`, the weight sync's buckets.
- :class:`TorchTrainer`, the ``torch`` trainer to build on (its optimizer :func:`adamw`, its checkpoint's
  :data:`OPTIMIZER_FILE`, :func:`resolve_loss`), and :class:`TrainSample`, a sample as the trainer packs it.
- :class:`MegatronHooks`, the call points of slime's megatron hooks for a megatron-based trainer.
- The run's layout: :func:`trainer_world_size`, :func:`named_model_folder`; trainer processes:
  :class:`ManagedProcess`, :func:`free_port`.

Names whose modules import torch load on first use.
"""

from typing import TYPE_CHECKING

from ._lazy import lazy_module_hooks

from .engines.launch.process_group import ManagedProcess, free_port
from .training.megatron_hooks import MegatronHooks
from .training_options import named_model_folder, trainer_world_size

if TYPE_CHECKING:
    from .training.batch import TrainSample
    from .training.torch_trainer import OPTIMIZER_FILE, TorchTrainer, adamw, resolve_loss
    from .training.trainer import LoraAdapter, PolicyTrainer, byte_buckets

_LAZY = {
    "PolicyTrainer": "rlsdk.training.trainer",
    "LoraAdapter": "rlsdk.training.trainer",
    "byte_buckets": "rlsdk.training.trainer",
    "TrainSample": "rlsdk.training.batch",
    "TorchTrainer": "rlsdk.training.torch_trainer",
    "OPTIMIZER_FILE": "rlsdk.training.torch_trainer",
    "adamw": "rlsdk.training.torch_trainer",
    "resolve_loss": "rlsdk.training.torch_trainer",
}

__getattr__, __dir__ = lazy_module_hooks(globals(), _LAZY)


__all__ = [
    "OPTIMIZER_FILE",
    "LoraAdapter",
    "ManagedProcess",
    "MegatronHooks",
    "PolicyTrainer",
    "TorchTrainer",
    "TrainSample",
    "adamw",
    "byte_buckets",
    "free_port",
    "named_model_folder",
    "resolve_loss",
    "trainer_world_size",
]
