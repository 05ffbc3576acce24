"""The engine protocol: SGLang's native HTTP API as Python calls.

Every engine (an SGLang server or router reached over HTTP, the embedded transformers engine in
process, a benchmark's instant engine) implements :class:`InferenceEngine`. Requests and responses
are the JSON bodies of SGLang's ``/generate`` (see ``shared/reference/sglang-protocol.md``), so one
client, one server (``rlsdk serve``) and one set of custom generators work against all of them.
"""

from __future__ import annotations

import abc
from typing import Any


class InferenceEngine(abc.ABC):
    """An engine speaking SGLang's protocol. ``url`` is its HTTP address when it has one."""

    url: str | None = None

    async def start(self) -> None:
        """Load models, open connections, start serving; called once before the first request."""

    @abc.abstractmethod
    async def generate(self, payload: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        """Handle one ``/generate`` body (``input_ids`` or ``text``, ``sampling_params``,
        ``return_logprob``, optional ``rid``); a batch body gives a list of responses."""

    @abc.abstractmethod
    async def abort(self, rid: str | None = None) -> None:
        """Abort one request by ``rid``, or every request in flight when ``rid`` is None.
        Aborted requests return what they generated so far with ``finish_reason.type == "abort"``."""

    async def wait_idle(self, timeout: float = 60.0) -> None:
        """Return once no request is running or waiting."""

    @abc.abstractmethod
    async def model_info(self) -> dict[str, Any]:
        """The ``/model_info`` body: ``model_path``, ``tokenizer_path``, ``weight_version``, ..."""

    async def pause(self) -> None:
        """Stop admitting new work (``/pause_generation``)."""

    async def resume(self) -> None:
        """Admit work again (``/continue_generation``)."""

    async def flush_cache(self) -> None:
        """Drop the prefix cache (``/flush_cache``)."""

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> None:
        """Reload weights from a checkpoint folder (``/update_weights_from_disk``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot update weights from disk")

    async def close(self) -> None:
        """Release the engine's resources."""

    async def __aenter__(self) -> InferenceEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
