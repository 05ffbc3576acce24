"""The public API for engine implementers: what an ``engine`` plugin (an :class:`InferenceEngine` speaking
SGLang's native protocol) builds on. Plugin authors of the other kinds need none of it (:mod:`rlsdk`).

- :class:`InferenceEngine`, the protocol; :class:`SGLangClient`, the client of an SGLang server or router
  (and of ``rlsdk serve``); the errors an engine raises (:class:`EngineError` and its kinds).
- :class:`EngineHTTP`, the HTTP side of a client of an engine server (a pooled session, a cap on requests in
  flight, retries with backoff, error answers as :class:`EngineError` kinds, streamed events), and its
  :class:`EngineReply`.
- SGLang's answers as an engine writes them: :func:`generate_response`, :func:`finish_stop`,
  :func:`finish_length`, :func:`finish_abort`, :func:`split_batch`, :func:`new_rid`.
- The weights check: :func:`tensor_checksum` (SGLang 0.5.17's) and :class:`ServedChecksums`; the tokenizer
  check: :func:`tokenizer_fingerprint` (what :meth:`InferenceEngine.tokenizer_info` returns).
- Weight transports (:meth:`InferenceEngine.update_weights_from_tensor`, ...): the trainer's weights arrive
  in buckets of :class:`FlatWeights` (every tensor's bytes in one tensor, with their names, shapes, dtypes).
- LoRA adapters for engines that merge them: :func:`read_lora_adapter`, :func:`lora_adapter_deltas`.

Names whose modules import aiohttp or torch load on first use.
"""

from typing import TYPE_CHECKING

from ._lazy import lazy_module_hooks

from .engines.engine import InferenceEngine
from .engines.lora_adapter import lora_adapter_deltas, read_lora_adapter
from .engines.protocol import (
    EngineError,
    EngineRequestError,
    EngineResponseError,
    EngineUnavailableError,
    finish_abort,
    finish_length,
    finish_stop,
    generate_response,
    new_rid,
    split_batch,
)
from .engines.tokenizer_facts import tokenizer_fingerprint
from .engines.weight_checksums import ServedChecksums, tensor_checksum

if TYPE_CHECKING:
    from .engines.engine_http import EngineHTTP, EngineReply
    from .engines.sglang_client import SGLangClient
    from .engines.tensor_transport import FlatWeights

_LAZY = {
    "EngineHTTP": "rlsdk.engines.engine_http",
    "EngineReply": "rlsdk.engines.engine_http",
    "SGLangClient": "rlsdk.engines.sglang_client",
    "FlatWeights": "rlsdk.engines.tensor_transport",
}

__getattr__, __dir__ = lazy_module_hooks(globals(), _LAZY)


__all__ = [
    "EngineError",
    "EngineHTTP",
    "EngineReply",
    "EngineRequestError",
    "EngineResponseError",
    "EngineUnavailableError",
    "FlatWeights",
    "InferenceEngine",
    "SGLangClient",
    "ServedChecksums",
    "finish_abort",
    "finish_length",
    "finish_stop",
    "generate_response",
    "lora_adapter_deltas",
    "new_rid",
    "read_lora_adapter",
    "split_batch",
    "tokenizer_fingerprint",
    "tensor_checksum",
]
