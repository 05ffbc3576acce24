"""The trainer protocol: what ``rlsdk run --train`` asks of a ``trainer`` plugin."""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..engines.weight_checksums import Layout, engine_checksums
from ..errors import PluginCallError, RlsdkError
from ..plugins.records import Resolved
from ..types import Sample
from ..config import RolloutConfig


@dataclass
class LoraAdapter:
    """A LoRA adapter as the trainer hands it to an engine in process: its PEFT config (what
    ``adapter_config.json`` holds) and its tensors under PEFT's saved names."""

    config: dict[str, Any]
    tensors: Mapping[str, Any]


class PolicyTrainer(abc.ABC):
    """Trains the policy on each step's kept groups and hands its weights to the engine.

    ``trainer(args)`` builds one from ``args.hf_checkpoint`` (a Hugging Face folder); the loop then calls
    :meth:`train_step` once per rollout step, :meth:`weights` (or :meth:`save_hf_model` for engines
    that load from disk) to sync, and :meth:`response_log_probs` for the trust check; :meth:`close` when
    the run ends.
    """

    @abc.abstractmethod
    def train_step(self, rollout_id: int, groups: list[list[Sample]]) -> dict[str, float]:
        """One rollout step's training: advantages, losses, optimizer steps. Returns ``train/*`` metrics."""

    @abc.abstractmethod
    def response_log_probs(self, samples: list[Sample]) -> list[list[float]]:
        """The current policy's log-probs of each sample's response tokens (at temperature 1)."""

    @abc.abstractmethod
    def weights(self) -> Mapping[str, Any]:
        """The policy's weights as a Hugging Face state dict, for engines in the same process."""

    def weight_buckets(self, bucket_bytes: int) -> Iterator[dict[str, Any]]:
        """:meth:`weights` in buckets of about ``bucket_bytes`` (a larger tensor is a bucket of its own), in
        order, for syncs that send one bucket at a time (``update_weight_buffer_size``). A trainer of several
        processes overrides it to gather one bucket at a time on its first rank, so that no rank ever holds
        the whole model; the default cuts :meth:`weights`. Iterate to the end: other ranks may take part in
        every bucket."""
        weights = self.weights()
        for names in byte_buckets(((name, _nbytes(t)) for name, t in weights.items()), bucket_bytes):
            yield {name: weights[name] for name in names}

    def weight_checksums(self, layout: Layout) -> dict[str, tuple[list[str], list[str]]]:
        """What an engine that fuses tensors as ``layout`` says must hold, for the trust check's exact
        comparison: per tensor of the engine, the Hugging Face names it is made of and the checksums
        (:func:`rlsdk.engine_api.tensor_checksum`) it may have (with a float32 tensor, also in the half-precision
        types an engine serves). Computed where the weights are, from :meth:`weights` by default; a trainer
        whose parameters are at hand overrides it to read them directly, so that an export that left a
        tensor out or stale is caught too."""
        return engine_checksums(self.weights(), layout)

    def tokenizer_info(self) -> dict[str, Any] | None:
        """The tokenizer the trainer's data is read with, as :func:`rlsdk.engine_api.tokenizer_fingerprint`
        gives it, for the run's check that the engine and the trainer agree on it; None (the default) where
        the trainer cannot say."""
        return None

    @abc.abstractmethod
    def save_hf_model(self, folder: Path) -> None:
        """Write the policy as a Hugging Face model folder (config, safetensors, tokenizer)."""

    @abc.abstractmethod
    def save_checkpoint(self, folder: Path) -> None:
        """Write everything :meth:`load_checkpoint` needs: the model, the optimizer, random states."""

    @abc.abstractmethod
    def load_checkpoint(self, folder: Path) -> None:
        """Restore the state :meth:`save_checkpoint` wrote."""

    def lora_adapter(self) -> LoraAdapter | None:
        """The LoRA adapter the policy trains, which is all the engine needs after its first weights; None
        (the default) when the trainer trains every weight."""
        return None

    def save_lora_adapter(self, folder: Path) -> None:
        """Write :meth:`lora_adapter` as a PEFT adapter folder (for engines that load adapters from disk)."""
        raise NotImplementedError(f"{type(self).__name__} trains no LoRA adapter")

    def offload(self) -> None:  # noqa: B027 (optional: a trainer with nothing to move keeps its memory)
        """Free the GPU memory training alone needs (optimizer state, gradients) while the engines generate
        on the same GPUs (``offload_train``); the weights stay, for the sync and the trust check."""

    def onload(self) -> None:  # noqa: B027 (optional, as offload)
        """Bring back what :meth:`offload` moved, before the next train step."""

    def close(self) -> None:  # noqa: B027 (optional: most trainers hold nothing beyond their process)
        """Release what outlives the trainer object otherwise (e.g. the processes of other ranks)."""


Key = TypeVar("Key")


def byte_buckets(sizes: Iterable[tuple[Key, int]], bucket_bytes: int) -> Iterator[list[Key]]:
    """Consecutive keys grouped so that no group's bytes exceed ``bucket_bytes`` (a key larger than that is
    a group of its own): ``sizes`` are ``(key, bytes)`` in order."""
    group: list[Key] = []
    total = 0
    for key, size in sizes:
        if group and total + size > bucket_bytes:
            yield group
            group, total = [], 0
        group.append(key)
        total += size
    if group:
        yield group


def _nbytes(tensor: Any) -> int:
    return int(tensor.numel()) * int(tensor.element_size())


def build_trainer(resolved: Resolved[Any], args: RolloutConfig) -> PolicyTrainer:
    """The trainer call point: ``trainer(args)`` from its plugin, checked to be a :class:`PolicyTrainer`
    (the run's trainer, a Ray trainer actor's, and :func:`rlsdk.testing.check_trainer`'s)."""
    try:
        trainer = resolved.func(args)
    except RlsdkError:
        raise
    except Exception as exc:
        raise PluginCallError(
            f"{resolved.describe()} building the trainer raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(trainer, PolicyTrainer):
        raise PluginCallError(
            f"{resolved.describe()} returned {type(trainer).__name__}: expected an rlsdk.trainer_api.PolicyTrainer"
        )
    return trainer
