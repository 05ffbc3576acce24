"""Detectors for runs that go on but are silently wrong (issue 48): each finding is a warning when it is found
and is repeated in the run's summary (``rlsdk run``'s last lines, and ``detected.json`` in the output folder).

- a reward that gives every sample the same value step after step (``constant_reward_steps``): a reward that
  never reads the answer, a label key that names nothing, a grader that always fails;
- a data column named but absent (``--label-key`` that no row has: an error before the engine starts; one
  some rows lack: a warning naming how many).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..config import RolloutConfig
from ..types import RolloutFnTrainOutput

DETECTED_FILE = "detected.json"
"""The run's findings, in its output folder: ``{"detected": [{"detector", "message"}, ...]}``."""


class SilentFailureWarning(RuntimeWarning):
    """A run that goes on but may be training on nothing: a detector's finding."""


@dataclass
class Detectors:
    """The findings of a run's detectors, kept for its summary; each one warned about once."""

    args: RolloutConfig
    folder: Path
    findings: list[dict[str, str]] = field(default_factory=list)
    constant: float | None = None
    """The one reward value of every sample of the last steps (None: the last step's varied)."""
    constant_steps: int = 0

    def report(self, detector: str, message: str) -> None:
        """Warn about a finding once and keep it for the summary."""
        if any(f["detector"] == detector for f in self.findings):
            return
        warnings.warn(message, SilentFailureWarning, stacklevel=3)
        self.findings.append({"detector": detector, "message": message})
        (self.folder / DETECTED_FILE).write_text(json.dumps({"detected": self.findings}, indent=1) + "\n")

    def after_step(self, rollout_id: int, result: RolloutFnTrainOutput) -> None:
        """The step-by-step detectors, after step ``rollout_id``."""
        self.check_constant_reward(rollout_id, result)

    def check_constant_reward(self, rollout_id: int, result: RolloutFnTrainOutput) -> None:
        limit = self.args.constant_reward_steps
        rewards = {
            s.reward
            for group in [*result.samples, *result.discarded]
            for s in group
            if isinstance(s.reward, int | float) and not isinstance(s.reward, bool)
        }
        if len(rewards) != 1:
            self.constant, self.constant_steps = None, 0
            return
        (value,) = rewards
        self.constant_steps = self.constant_steps + 1 if value == self.constant else 1
        self.constant = value
        if limit and self.constant_steps >= limit:
            self.report(
                "constant_reward",
                f"the reward {self.args.rm_type!r} gave every sample {value:g} in each of the {self.constant_steps} "
                f"steps up to step {rollout_id}: no group has an advantage, nothing is learned. Check that the "
                "reward reads the response and the label (--label-key), with rlsdk score on a few rows "
                "(--constant-reward-steps 0 turns this check off)",
            )
