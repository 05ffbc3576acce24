"""slime's ``rm_hub.gpqa`` names."""

from ..slime_verdicts import GPQA_LETTERS as DEFAULT_VALID_LETTERS
from ..slime_verdicts import gpqa_letter as _extract_letter_from_response
from ..slime_verdicts import gpqa_reward as compute_gpqa_reward

__all__ = ["DEFAULT_VALID_LETTERS", "_extract_letter_from_response", "compute_gpqa_reward"]
