"""slime's ``rm_hub.f1`` names."""

from ..f1 import f1_score, normalize_answer

__all__ = ["f1_score", "normalize_answer"]
