"""The engine protocol: SGLang's native HTTP API as Python calls, and the client for real SGLang.

Every engine (an SGLang server or router reached over HTTP, the embedded transformers engine in
process, :class:`rlsdk.testing.FakeEngine`) implements :class:`InferenceEngine`. Requests and responses
are the JSON bodies of SGLang's ``/generate`` (real ones in ``tests/fixtures/sglang-0.5.17.json``), so
one client (:class:`rlsdk.engine_api.SGLangClient`), one server (:mod:`rlsdk.run.engine_server`, behind
``rlsdk serve``) and one set of custom generators work against all of
them.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from .. import _moved
from .protocol import EngineError, EngineRequestError, EngineUnavailableError
from .weight_checksums import ServedChecksums

if TYPE_CHECKING:
    from .tensor_transport import FlatWeights

__all__ = ["EngineError", "EngineRequestError", "EngineUnavailableError", "InferenceEngine"]
__getattr__ = _moved.forward(__name__, {"SGLangClient": "rlsdk.engine_api"})


class InferenceEngine(abc.ABC):
    """An engine speaking SGLang's protocol. ``url`` is its HTTP address when it has one."""

    url: str | None = None

    async def start(self) -> None:
        """Load models, open connections, start serving; called once before the first request."""

    @abc.abstractmethod
    async def generate(self, payload: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        """Handle one ``/generate`` body (``input_ids`` or ``text``, ``sampling_params``,
        ``return_logprob``, optional ``rid``); a batch body gives a list of responses.
        A malformed body raises :class:`EngineRequestError`."""

    async def generate_stream(self, payload: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Stream one ``/generate`` body: cumulative responses, the last one with ``finish_reason``.
        The default yields the whole response once."""
        yield await self.generate(payload)  # type: ignore[misc]

    @abc.abstractmethod
    async def abort(self, rid: str | None = None) -> None:
        """Abort one request by ``rid``, or every request in flight when ``rid`` is None.
        Aborted requests return what they generated so far with ``finish_reason.type == "abort"``."""

    async def load(self) -> dict[str, int]:
        """Requests now running and waiting: ``num_running_reqs``, ``num_waiting_reqs``."""
        return {"num_running_reqs": 0, "num_waiting_reqs": 0}

    async def wait_idle(self, timeout: float = 60.0) -> None:
        """Return once no request is running or waiting; TimeoutError after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            load = await self.load()
            if load["num_running_reqs"] + load["num_waiting_reqs"] == 0:
                return
            if loop.time() > deadline:
                raise TimeoutError(f"{type(self).__name__} still busy after {timeout:.0f}s: {load}")
            await asyncio.sleep(0.05)

    @abc.abstractmethod
    async def model_info(self) -> dict[str, Any]:
        """The ``/model_info`` body: ``model_path``, ``tokenizer_path``, ``weight_version``, ..."""

    async def pause(self, mode: str = "abort") -> None:
        """Stop admitting new work (``/pause_generation``). ``abort`` (SGLang's default) aborts the
        requests in flight; ``in_place`` and ``retract`` keep them to finish after :meth:`resume`."""

    async def resume(self) -> None:
        """Admit work again (``/continue_generation``)."""

    async def flush_cache(self) -> bool:
        """Drop the prefix cache (``/flush_cache``); False (not flushed) while requests run."""
        return True

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> None:
        """Reload weights from a checkpoint folder (``/update_weights_from_disk``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot update weights from disk")

    async def pull_weights(self, pull: Any, weight_version: str | None = None) -> None:
        """Bring this engine's host's local checkpoint to a published delta version (a
        :class:`rlsdk.engines.delta_weights.DeltaPull`), then reload it (:meth:`update_weights_from_disk`).
        Applied in this process by default; an engine on another host (a Ray actor) applies it there."""
        await asyncio.to_thread(pull.apply)
        await self.update_weights_from_disk(pull.local, weight_version)

    in_process_weights: bool = False
    """Whether :meth:`update_weights` takes tensors of this process (no round trip through disk)."""

    async def update_weights(self, state_dict: Any, weight_version: str | None = None) -> None:
        """Copy a Hugging Face state dict of this process into the served model (``in_process_weights``)."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot take weights in process: use update_weights_from_disk"
        )

    weight_transports: frozenset[str] = frozenset()
    """The GPU transports that bring the trainer's weights here besides disk (and in process): ``"tensor"``
    (CUDA IPC from a trainer on the same GPUs: :meth:`update_weights_from_tensor`) and ``"nccl"`` (a
    broadcast from the trainer: :meth:`join_weight_broadcast`, :meth:`update_weights_from_distributed`).
    ``--weight-sync`` names one the engine lacks: the run is refused before it starts."""

    async def release_memory(self, tags: list[str] | None = None) -> None:
        """Give up GPU memory while a colocated trainer trains: of ``"weights"``, ``"kv_cache"`` and
        ``"cuda_graph"`` (SGLang's names; None: all); no request runs until all is back."""
        raise NotImplementedError(f"{type(self).__name__} cannot release its GPU memory")

    async def resume_memory(self, tags: list[str] | None = None) -> None:
        """Take back the memory of ``tags`` released before (None: all); generation resumes once all is back."""
        raise NotImplementedError(f"{type(self).__name__} cannot release its GPU memory")

    async def update_weights_from_tensor(
        self, buckets: AsyncIterator[tuple[FlatWeights, bool]], weight_version: str, flush_cache: bool = True
    ) -> None:
        """Load the trainer's weights from tensors on the GPUs this engine shares with it (CUDA IPC), one
        bucket at a time (each with whether it is the last), then serve them as ``weight_version``
        (``flush_cache``: dropping the prefix cache). Drop each bucket before asking for the next: the trainer
        frees its copy then. An engine that stops half way keeps reporting the version it had."""
        raise NotImplementedError(f"{type(self).__name__} cannot take weights by CUDA IPC")

    async def join_weight_broadcast(self, master_address: str, backend: str = "nccl") -> None:
        """Form a group with the trainer (this process, rank 0, at ``master_address``) in which it broadcasts
        weights; both sides of the rendezvous are the engine's, since its protocol decides them. Once: later
        calls return at once."""
        raise NotImplementedError(f"{type(self).__name__} cannot take weights by broadcast")

    async def update_weights_from_distributed(
        self, buckets: AsyncIterator[tuple[FlatWeights, bool]], weight_version: str
    ) -> None:
        """Broadcast each bucket to the group :meth:`join_weight_broadcast` formed while the engine receives
        it, then serve the weights as ``weight_version`` (the prefix cache dropped)."""
        raise NotImplementedError(f"{type(self).__name__} cannot take weights by broadcast")

    async def load_lora_adapter(self, lora_name: str, lora_path: str) -> None:
        """Load the PEFT adapter folder ``lora_path`` as ``lora_name`` (``/load_lora_adapter``); requests that
        name it in ``lora_path`` are served with it."""
        raise NotImplementedError(f"{type(self).__name__} cannot load LoRA adapters")

    async def load_lora_adapter_tensors(
        self, lora_name: str, config: dict[str, Any], tensors: Mapping[str, Any]
    ) -> None:
        """Load an adapter given as its PEFT config and tensors of this process (``in_process_weights``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot take a LoRA adapter in process")

    async def unload_lora_adapter(self, lora_name: str) -> None:
        """Drop the adapter ``lora_name`` (``/unload_lora_adapter``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot unload LoRA adapters")

    async def update_weight_version(self, version: str) -> None:
        """Set the ``weight_version`` the engine reports (``/update_weight_version``), e.g. after an adapter
        changed what it serves."""
        raise NotImplementedError(f"{type(self).__name__} cannot set its weight version")

    async def weight_checksums(self) -> list[ServedChecksums] | None:
        """The checksum (:func:`rlsdk.engine_api.tensor_checksum`) of every tensor the engine holds, by its own names,
        one entry per holder of a copy of the weights (SGLang's ``/weights_checker`` with
        ``{"action": "checksum"}``): the trust check compares them with the trainer's, bit for bit. None
        (the default) where the engine offers none; the log-prob checks then decide alone."""
        return None

    async def nondeterminism(self) -> str | None:
        """Why two runs with the same seeds may get different outputs from this engine (a sentence), or None
        where every request's output depends only on its body (its ``sampling_seed`` included). Deterministic
        mode (``--deterministic``) reports it. The default says the engine does not tell."""
        return f"the engine {type(self).__name__} does not say whether its outputs are reproducible"

    async def tokenizer_info(self) -> dict[str, Any] | None:
        """The tokenizer the engine samples with, as :func:`rlsdk.engine_api.tokenizer_fingerprint` gives it, for
        the run's check that the engine and the trainer agree on it. None (the default) where the engine
        cannot say; the run then says once that it is not compared."""
        return None

    def replicas(self) -> list[InferenceEngine]:
        """The engines behind this one that each serve their own copy of the weights (an engine pool's live
        members); the trust check probes each. An engine on its own is its only replica."""
        return [self]

    def remember_trust_probe(self, probe: Any) -> None:
        """Called with the :class:`~rlsdk.training.sync.TrustProbe` every replica just passed; an engine pool
        checks an engine it restarts against it."""

    async def close(self) -> None:
        """Release the engine's resources."""

    async def __aenter__(self) -> InferenceEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
