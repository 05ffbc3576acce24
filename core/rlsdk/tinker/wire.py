"""The Tinker SDK's wire formats, read and written with the schemas the pinned ``tinker`` package ships: its
protobuf messages (``tinker.proto.tinker_public_pb2``: ``forward_backward`` requests, their outputs, sample
responses) and its pydantic request models (every JSON body). A body that does not fit is a
:class:`WireError` naming the field, which the server answers with 400."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

MAX_TOKENS_PER_DATUM = 1 << 20
"""Longest ``model_input`` a datum may have (a bound checked before any work)."""
MASK_LOGPROB = -99999.0
"""An empty top-k cell's log-prob, with token id 0 (the SDK's sentinel)."""


class WireError(ValueError):
    """A request body that does not fit the Tinker wire format; the message names the field."""


@dataclass
class Datum:
    """One ``forward_backward`` datum: its input tokens and its ``loss_fn_inputs`` as 1-D arrays."""

    tokens: np.ndarray
    """int64 token ids of ``model_input``."""
    inputs: dict[str, np.ndarray]
    """``loss_fn_inputs``: ``target_tokens`` (int64), ``weights``/``logprobs``/``advantages`` (float32), ..."""


@dataclass
class ForwardBackward:
    """A ``/api/v1/forward_backward`` request (one chunk of a client's batch)."""

    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float | str]
    forward_only: bool
    data: list[Datum]


def _proto() -> Any:
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2


_NUMPY_DTYPES = {1: np.float32, 2: np.int64, 3: np.int32}
"""Proto ``DType`` -> numpy: FLOAT32, INT64, INT32 (bfloat16, 4, is widened separately)."""


def read_forward_backward(body: bytes) -> ForwardBackward:
    """Parse a ``ForwardBackwardRequest`` protobuf body; every datum's tokens and tensors checked."""
    from google.protobuf.message import DecodeError

    message = _proto().ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except DecodeError as exc:
        raise WireError(f"body: not a ForwardBackwardRequest protobuf message ({exc})") from None
    if not message.model_id:
        raise WireError("model_id: missing")
    config: dict[str, float | str] = {key: float(value) for key, value in message.loss_fn_config.items()}
    for key, value in message.loss_fn_config_v2.items():  # preferred where both are set
        kind = value.WhichOneof("value")
        if kind is None:
            raise WireError(f"loss_fn_config_v2[{key!r}]: neither number nor text")
        config[key] = value.number if kind == "number" else value.text
    data = [_read_datum(datum, f"data[{i}]") for i, datum in enumerate(message.data)]
    if not data:
        raise WireError("data: no datums")
    return ForwardBackward(
        model_id=message.model_id,
        seq_id=message.seq_id,
        loss_fn=message.loss_fn,
        config=config,
        forward_only=message.forward_only,
        data=data,
    )


def _read_datum(datum: Any, where: str) -> Datum:
    pieces = []
    for j, chunk in enumerate(datum.model_input):
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise WireError(
                f"{where}.model_input[{j}]: {kind or 'an empty'} chunk; this server trains on text "
                "(encoded_text chunks) only"
            )
        pieces.append(_buffer(chunk.encoded_text.tokens, np.int32, f"{where}.model_input[{j}].tokens"))
    tokens = np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, np.int64)
    if not 0 < len(tokens) <= MAX_TOKENS_PER_DATUM:
        raise WireError(f"{where}.model_input: {len(tokens)} tokens (1 to {MAX_TOKENS_PER_DATUM} allowed)")
    inputs = {
        name: read_tensor(tensor, f"{where}.loss_fn_inputs[{name!r}]")
        for name, tensor in datum.loss_fn_inputs.items()
    }
    return Datum(tokens=tokens, inputs=inputs)


def _buffer(raw: bytes, dtype: Any, where: str) -> np.ndarray:
    size = np.dtype(dtype).itemsize
    if len(raw) % size:
        raise WireError(f"{where}: {len(raw)} bytes, not a whole number of {np.dtype(dtype).name} values")
    return np.frombuffer(raw, dtype=dtype)


def read_tensor(tensor: Any, where: str) -> np.ndarray:
    """A protobuf ``Tensor`` (dense or sparse CSR) as a flat numpy array (float32 or int64)."""
    dtype = tensor.dtype
    if dtype == 4:  # bfloat16: the upper half of a float32
        to_numpy = lambda raw, at: (_buffer(raw, np.uint16, at).astype(np.uint32) << 16).view(np.float32)  # noqa: E731
    elif dtype in _NUMPY_DTYPES:
        to_numpy = lambda raw, at: _buffer(raw, _NUMPY_DTYPES[dtype], at)  # noqa: E731
    else:
        raise WireError(f"{where}.dtype: {dtype} is not one of FLOAT32, INT64, INT32, BFLOAT16")
    shape = list(tensor.shape)
    if any(s < 0 for s in shape):
        raise WireError(f"{where}.shape: {shape} has a negative size")
    count = math.prod(shape) if shape else None
    if count is not None and count > MAX_TOKENS_PER_DATUM * 64:
        raise WireError(f"{where}.shape: {shape} holds more than {MAX_TOKENS_PER_DATUM * 64} values")
    if tensor.HasField("sparse_csr"):
        if len(shape) != 2:
            raise WireError(f"{where}.shape: a sparse CSR tensor needs a 2-D shape, got {shape}")
        csr = tensor.sparse_csr
        values = to_numpy(csr.values, f"{where}.sparse_csr.values")
        rows = _buffer(csr.crow_indices, np.int64, f"{where}.sparse_csr.crow_indices")
        cols = _buffer(csr.col_indices, np.int64, f"{where}.sparse_csr.col_indices")
        if len(rows) != shape[0] + 1 or len(cols) != len(values) or (len(rows) and rows[-1] != len(values)):
            raise WireError(f"{where}.sparse_csr: indices do not fit shape {shape} and {len(values)} values")
        if np.any(np.diff(rows) < 0) or np.any((cols < 0) | (cols >= shape[1])):
            raise WireError(f"{where}.sparse_csr: row pointers must rise and columns lie in [0, {shape[1]})")
        dense = np.zeros(shape, dtype=values.dtype)
        dense[np.repeat(np.arange(shape[0]), np.diff(rows)), cols] = values
        array = dense.reshape(-1)
    else:
        array = to_numpy(tensor.dense, f"{where}.dense")
        if count is not None and len(array) != count:
            raise WireError(f"{where}: {len(array)} values for shape {shape}")
    return array.astype(np.int64 if array.dtype.kind in "iu" else np.float32)


@dataclass
class Sampled:
    """One sampled sequence as the engine returned it."""

    tokens: list[int]
    logprobs: list[float]
    stopped: bool
    """Stopped by EOS, a stop token or a stop string (``stop``); else it ran out of tokens (``length``)."""


@dataclass
class SampleOutput:
    """What ``/api/v1/asample`` answers: sequences, and the prompt's log-probs where asked."""

    sequences: list[Sampled]
    prompt_logprobs: list[float | None] | None = None
    topk_prompt_logprobs: list[list[tuple[int, float]] | None] | None = None
    topk_width: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def write_sample_response(output: SampleOutput) -> bytes:
    """A ``SampleResponse`` protobuf message."""
    proto = _proto()
    message = proto.SampleResponse()
    for sequence in output.sequences:
        item = message.sequences.add()
        item.stop_reason = proto.STOP_REASON_STOP if sequence.stopped else proto.STOP_REASON_LENGTH
        item.tokens = np.asarray(sequence.tokens, dtype=np.int32).tobytes()
        item.logprobs = np.asarray(sequence.logprobs, dtype=np.float32).tobytes()
    if output.prompt_logprobs is not None:
        values = [math.nan if lp is None else lp for lp in output.prompt_logprobs]
        message.prompt_logprobs = np.asarray(values, dtype=np.float32).tobytes()
    if output.topk_prompt_logprobs is not None and output.topk_width > 0:
        k, rows = output.topk_width, output.topk_prompt_logprobs
        ids = np.zeros((len(rows), k), dtype=np.int32)
        logprobs = np.full((len(rows), k), MASK_LOGPROB, dtype=np.float32)
        for i, row in enumerate(rows):
            for j, (token, logprob) in enumerate((row or [])[:k]):
                ids[i, j], logprobs[i, j] = token, logprob
        top = message.topk_prompt_logprobs
        top.token_ids, top.logprobs, top.k, top.length = ids.tobytes(), logprobs.tobytes(), k, len(rows)
    return bytes(message.SerializeToString())


def write_forward_backward_output(
    outputs: Sequence[dict[str, np.ndarray]], metrics: dict[str, float]
) -> bytes:
    """A ``ForwardBackwardOutput`` protobuf message: one ``ArrayRecord`` whose fields hold every datum's 1-D
    array back to back (``offsets`` in bytes), and the metrics (``name:reduction`` keys)."""
    proto = _proto()
    message = proto.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for key, value in metrics.items():
        message.metrics[key] = float(value)
    record = message.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(outputs))
    for name in outputs[0] if outputs else []:
        arrays = [np.ascontiguousarray(out[name]) for out in outputs]
        is_int = arrays[0].dtype.kind in "iu"
        arrays = [a.astype(np.int64 if is_int else np.float32).reshape(-1) for a in arrays]
        sizes = [0, *np.cumsum([a.nbytes for a in arrays]).tolist()]
        batched = record.fields[name]
        batched.data = b"".join(a.tobytes() for a in arrays)
        batched.offsets = np.asarray(sizes, dtype=np.int64).tobytes()
        batched.dtype = proto.DTYPE_INT64 if is_int else proto.DTYPE_FLOAT32
    return bytes(message.SerializeToString())


Model = TypeVar("Model")


def parse_json(model: type[Model], body: Any) -> Model:
    """``body`` (decoded JSON) validated as the SDK's pydantic request ``model``; a mismatch is a
    :class:`WireError` naming the fields."""
    import pydantic

    try:
        return model.model_validate(body)  # type: ignore[attr-defined]
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'body'}: {error['msg']}"
            for error in exc.errors()[:5]
        )
        raise WireError(f"{model.__name__}: {problems}") from None


def dump(value: Any) -> Any:
    """An SDK response model as JSON data (what the client validates strictly)."""
    return value.model_dump(mode="json", exclude_none=False)
