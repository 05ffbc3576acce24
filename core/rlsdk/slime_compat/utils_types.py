"""Stands in for ``slime.utils.types``."""

from ..types import Sample

__all__ = ["Sample"]
