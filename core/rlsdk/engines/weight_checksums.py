"""Weight checksums as SGLang's weights checker reports them (``POST /weights_checker`` with
``{"action": "checksum"}``, SGLang 0.5.17), so that the trust check can compare every tensor an engine
holds with the trainer's, bit for bit.

The checksum of one tensor reads its bytes as little-endian 32-bit words (zero-padded to a multiple of
four bytes). Each word ``v`` at index ``i`` mixes into two 32-bit lanes, ``fmix32(v ^ p(i))`` with a
position term ``p(i) = (i * A + seed) ^ rotl32(i, r)`` per lane; the lanes are summed (mod 2**32) over
tiles of 8,192 words, each tile's two sums are xored with the tensor's byte count and mixed again into one
64-bit value (first lane high), the tiles' values are summed (mod 2**64), and the sum goes through
splitmix64's finalizer. The result is printed as 16 hex digits. ``fmix32`` is MurmurHash3's finalizer.

Engines keep some tensors fused: SGLang holds a layer's ``q_proj``, ``k_proj`` and ``v_proj`` as one
``qkv_proj`` (rows in that order) and ``gate_proj`` and ``up_proj`` as one ``gate_up_proj``;
:data:`SGLANG_FUSED` says so, and :func:`engine_tensors` builds what such an engine holds from a Hugging
Face state dict. torch is imported on first use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Layout = Mapping[str, tuple[str, ...]]
"""Fused tensors of an engine: the fused name part (``".qkv_proj."``) -> the Hugging Face name parts whose
tensors it concatenates along the first dimension, in order."""

SGLANG_FUSED: Layout = {
    ".qkv_proj.": (".q_proj.", ".k_proj.", ".v_proj."),
    ".gate_up_proj.": (".gate_proj.", ".up_proj."),
}
"""How SGLang holds the dense Llama, Qwen2 and Qwen3 families' tensors."""

UNFUSED: Layout = {}
"""An engine that holds the Hugging Face state dict as it is (the embedded engine)."""

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
_SEED = 0x243F6A88
_LANES = (  # (position multiplier, seed, rotation) per lane
    (0x27D4EB2D, _SEED & _M32, 15),
    (0x165667B1, ((_SEED * 0x9E3779B1) ^ 0xDEADBEEF) & _M32, 13),
)
_FMIX = (0x85EBCA6B, 0xC2B2AE35)
_TILE = 8192
_BATCH = 2048 * _TILE
"""Words hashed at a time (16M): several small tensors in one pass, a large one in pieces of whole tiles; bounds
the temporaries to a few hundred MB whatever the model's size."""


def tensor_checksum(tensor: Any) -> str:
    """The checksum of ``tensor``'s bytes (its dtype as it is), on the device it is on."""
    return tensor_checksums([tensor])[0]


def tensor_checksums(tensors: Sequence[Any]) -> list[str]:
    """:func:`tensor_checksum` of each of ``tensors``, hashed in batches of up to 16M words: a few dozen
    kernels a batch, where one tensor at a time costs as many per tensor (a model's hundreds of tensors
    took 0.8 s that way on an H200).

    The arithmetic is int32 with two's-complement wrap-around, as 32-bit unsigned arithmetic needs (right
    shifts masked to be logical); sums are taken in int64, over tiles by differences of a running sum."""
    words = [_words(t) for t in tensors]
    sums = [[0, 0] for _ in tensors]  # each tensor's two lanes: its tiles' values, summed
    pieces = [(i, a, min(a + _BATCH, len(w))) for i, w in enumerate(words) for a in range(0, len(w), _BATCH)]
    batch: list[tuple[int, int, int]] = []
    for piece in pieces:
        size = sum(b - a for _, a, b in batch)
        if batch and (
            size + piece[2] - piece[1] > _BATCH or words[piece[0]].device != words[batch[0][0]].device
        ):
            _hash_pieces(batch, words, sums)
            batch = []
        batch.append(piece)
    if batch:
        _hash_pieces(batch, words, sums)
    return [f"{_splitmix64(((high << 32) + low) & _M64):016x}" for high, low in sums]


def _words(tensor: Any) -> Any:
    """``tensor``'s bytes as int32 words, zero-padded to a multiple of four bytes."""
    import torch

    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    if data.numel() % 4:
        data = torch.cat([data, data.new_zeros(4 - data.numel() % 4)])
    return data.view(torch.int32)


def _hash_pieces(batch: list[tuple[int, int, int]], words: list[Any], sums: list[list[int]]) -> None:
    """Add to ``sums`` the lane values of the tiles of each piece ``(tensor, first word, end)`` of
    ``batch``; a piece starts on a tile boundary of its tensor."""
    import torch

    device = words[batch[0][0]].device

    def ints(values: list[int]) -> Any:
        return torch.tensor(values, dtype=torch.int64, device=device)

    counts = ints([b - a for _, a, b in batch])
    flat = torch.cat([words[i][a:b] for i, a, b in batch])
    piece_of_word = torch.repeat_interleave(torch.arange(len(batch), device=device), counts)
    begins = torch.cumsum(counts, 0) - counts  # each piece's first word in ``flat``
    index = (
        torch.arange(len(flat), device=device)
        - begins[piece_of_word]
        + ints([a for _, a, _ in batch])[piece_of_word]
    )
    tiles = (counts + _TILE - 1) // _TILE
    piece_of_tile = torch.repeat_interleave(torch.arange(len(batch), device=device), tiles)
    first_tile = torch.cumsum(tiles, 0) - tiles
    tile_begin = (
        begins[piece_of_tile]
        + (torch.arange(len(piece_of_tile), device=device) - first_tile[piece_of_tile]) * _TILE
    )
    tile_end = torch.minimum(tile_begin + _TILE, (begins + counts)[piece_of_tile])
    byte_counts = ints([_signed(len(words[i]) * 4) for i, _, _ in batch]).to(torch.int32)[piece_of_tile]
    index = index.to(torch.int32)
    lanes = []
    for multiplier, seed, rotation in _LANES:
        position = (index * _signed(multiplier) + _signed(seed)) ^ _rotl32(index, rotation)
        mixed = _fmix32(flat ^ position).to(torch.int64) & _M32
        running = torch.cat([mixed.new_zeros(1), torch.cumsum(mixed, 0)])
        per_tile = (running[tile_end] - running[tile_begin]) & _M32
        per_tile = (per_tile - ((per_tile >> 31) << 32)).to(torch.int32)  # the same bits, as int32
        values = _fmix32(per_tile ^ byte_counts).to(torch.int64) & _M32
        running = torch.cat([values.new_zeros(1), torch.cumsum(values, 0)])
        ends = torch.cumsum(tiles, 0)
        lanes.append(running[ends] - running[ends - tiles])
    for (i, _, _), high, low in zip(batch, *(lane.tolist() for lane in lanes), strict=True):
        sums[i][0] += high
        sums[i][1] += low


def _signed(value: int) -> int:
    """A 32-bit pattern as the int32 that holds it."""
    value &= _M32
    return value - (1 << 32) if value >= 1 << 31 else value


def _srl32(x: Any, bits: int) -> Any:
    """Logical right shift of int32 words."""
    return (x >> bits) & ((1 << (32 - bits)) - 1)


def _rotl32(x: Any, bits: int) -> Any:
    return (x << bits) | _srl32(x, 32 - bits)


def _fmix32(x: Any) -> Any:
    x = x ^ _srl32(x, 16)
    x = x * _signed(_FMIX[0])
    x = x ^ _srl32(x, 13)
    x = x * _signed(_FMIX[1])
    return x ^ _srl32(x, 16)


def _splitmix64(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def engine_names(names: list[str], layout: Layout) -> dict[str, list[str]]:
    """Each tensor an engine of ``layout`` holds -> the Hugging Face names it is made of, in order. A
    fused tensor missing one of its parts is left out: this model has no such fusion."""
    held: dict[str, list[str]] = {}
    fused_parts: dict[str, dict[int, str]] = {}
    wholes: dict[str, str] = {}
    for name in names:
        match = next(
            (
                (whole, i, part)
                for whole, parts in layout.items()
                for i, part in enumerate(parts)
                if part in name
            ),
            None,
        )
        if match is None:
            held[name] = [name]
            continue
        whole, i, part = match
        fused = name.replace(part, whole)
        fused_parts.setdefault(fused, {})[i] = name
        wholes[fused] = whole
    for fused, parts in fused_parts.items():
        if len(parts) == len(layout[wholes[fused]]):
            held[fused] = [parts[i] for i in sorted(parts)]
    return held


def engine_tensors(weights: Mapping[str, Any], layout: Layout) -> dict[str, tuple[Any, list[str]]]:
    """What an engine of ``layout`` holds, built from a Hugging Face state dict: name -> (tensor, its parts'
    names). Tensors that share memory (tied embeddings) count once, under their first name."""
    import torch

    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    unique = []
    for name, tensor in weights.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            unique.append(name)
    return {
        fused: (weights[parts[0]] if len(parts) == 1 else torch.cat([weights[p] for p in parts]), parts)
        for fused, parts in engine_names(unique, layout).items()
    }


def engine_checksums(weights: Mapping[str, Any], layout: Layout) -> dict[str, tuple[list[str], list[str]]]:
    """What an engine of ``layout`` must hold of a Hugging Face state dict: per tensor of the engine, the
    names it is made of and the checksums it may have (:func:`served_checksums`)."""
    held = engine_tensors(weights, layout)
    sums = served_checksums([tensor for tensor, _ in held.values()])
    return {
        name: (parts, sorted(checksums))
        for (name, (_, parts)), checksums in zip(held.items(), sums, strict=True)
    }


def served_checksums(tensors: Sequence[Any]) -> list[set[str]]:
    """The checksums each of ``tensors`` may have on an engine: as it is, and, for float32, also rounded to
    the half-precision types an engine may serve it in. Converted and hashed about 1 GB at a time."""
    import torch

    out: list[set[str]] = []
    group: list[Any] = []
    for number, tensor in enumerate(tensors):
        group.append(tensor)
        if sum(t.numel() * t.element_size() for t in group) >= 2**30 or number == len(tensors) - 1:
            forms = [
                (j, form)
                for j, t in enumerate(group)
                for form in (
                    [t, t.to(torch.bfloat16), t.to(torch.float16)] if t.dtype == torch.float32 else [t]
                )
            ]
            sums: list[set[str]] = [set() for _ in group]
            for (j, _), checksum in zip(forms, tensor_checksums([form for _, form in forms]), strict=True):
                sums[j].add(checksum)
            out += sums
            group = []
    return out


@dataclass
class ServedChecksums:
    """What one holder of an engine's weights (a server, or one of its tensor-parallel ranks) reports: its
    tensors' checksums by its own names, how it fuses tensors, and its tensor-parallel size (a rank of a
    larger group holds shards, which the trainer's whole tensors cannot be compared with)."""

    holder: str
    checksums: dict[str, str]
    layout: Layout = field(default_factory=dict)
    tp_size: int = 1


def sglang_checksums(body: Any, holder: str, layout: Layout) -> list[ServedChecksums]:
    """SGLang's ``/weights_checker`` answer (``ranks``: one entry per tensor-parallel rank) as
    :class:`ServedChecksums`; ``ValueError`` when it is not that shape. A rank that names a fused tensor's
    parts itself holds them unfused (``rlsdk serve``: the embedded engine keeps Hugging Face's tensors)."""
    parts = [part for fused in layout.values() for part in fused]
    ranks = body.get("ranks") if isinstance(body, dict) else None
    if not isinstance(ranks, list) or not ranks:
        raise ValueError(f"no 'ranks' list in {str(body)[:200]!r}")
    served = []
    for rank in ranks:
        checksums, info = rank.get("checksums"), rank.get("parallelism_info") or {}
        if not isinstance(checksums, dict):
            raise ValueError(f"a rank without a 'checksums' mapping in {str(body)[:200]!r}")
        tp_rank, tp_size = int(info.get("tp_rank", 0)), int(info.get("tp_size", 1))
        where = holder if tp_size == 1 else f"{holder} (tensor-parallel rank {tp_rank} of {tp_size})"
        held = UNFUSED if any(part in str(name) for name in checksums for part in parts) else layout
        served.append(ServedChecksums(where, {str(k): str(v) for k, v in checksums.items()}, held, tp_size))
    return served


def sglang_answer(ranks: list[dict[str, str]]) -> dict[str, Any]:
    """The ``/weights_checker`` answer of a server whose ranks (each a whole copy: tensor-parallel size 1)
    hold these checksums, as SGLang writes it."""
    keys = ("tp_rank", "tp_size", "dp_rank", "dp_size", "pp_rank", "pp_size", "rank", "size")
    entries, engine_digest = [], hashlib.sha256()
    for checksums in ranks:
        digest = hashlib.sha256()
        for name in sorted(checksums):
            digest.update(name.encode())
            digest.update(checksums[name].encode())
        per_gpu = digest.hexdigest()
        engine_digest.update(per_gpu.encode())
        info = {key: 1 if key.endswith("size") else 0 for key in keys}
        entries.append({"checksums": checksums, "per_gpu_checksum": per_gpu, "parallelism_info": info})
    return {
        "success": True,
        "message": "",
        "ranks": entries,
        "per_engine_checksum": engine_digest.hexdigest(),
    }
