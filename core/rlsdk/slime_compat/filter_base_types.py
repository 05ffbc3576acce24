"""Stands in for ``slime.rollout.filter_hub.base_types``."""

from __future__ import annotations

from typing import Any

from ..types import DynamicFilterOutput

__all__ = ["DynamicFilterOutput", "call_dynamic_filter", "should_drop_dynamic_filter_output"]


def call_dynamic_filter(fn: Any, *args: Any, **kwargs: Any) -> DynamicFilterOutput:
    """A filter's verdict as a DynamicFilterOutput (a bare bool is ``keep``; no filter keeps)."""
    if fn is None:
        return DynamicFilterOutput(keep=True)
    output = fn(*args, **kwargs)
    return output if isinstance(output, DynamicFilterOutput) else DynamicFilterOutput(keep=output)


def should_drop_dynamic_filter_output(
    output: DynamicFilterOutput, *, remaining_batch_size: int, target_data_size: int
) -> bool:
    """Drop a rejected group unless it may be kept while candidates are short."""
    if output.keep:
        return False
    return not (output.keep_when_insufficient and remaining_batch_size <= target_data_size)
