"""Stands in for ``slime.backends.megatron_utils.cp_utils``: rlsdk's trainers train without context
parallelism (one rank holds a sequence's whole response), so gathering a response's values across ranks and
slicing out a rank's share both give the values as they are, as slime's do at a context-parallel size of 1."""

from __future__ import annotations

from collections.abc import Sized
from typing import TypeVar

__all__ = ["all_gather_with_cp", "slice_log_prob_with_cp"]

Values = TypeVar("Values")
SizedValues = TypeVar("SizedValues", bound=Sized)


def all_gather_with_cp(tensor: Values, total_length: int, response_length: int) -> Values:
    """A response's per-token values from every context-parallel rank: here, the one rank's."""
    return tensor


def slice_log_prob_with_cp(log_prob: SizedValues, total_length: int, response_length: int) -> SizedValues:
    """This rank's share of a response's per-token values: all of them (``response_length`` entries)."""
    count = len(log_prob)
    if count != response_length:
        raise ValueError(
            f"log_prob length mismatch: {count} values for a response of {response_length} tokens "
            f"(total_length {total_length})"
        )
    return log_prob
