"""The step ledger: every sample that enters a rollout step leaves it exactly once, accounted for."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import RlsdkError
from ..types import Sample

Group = list[Sample]


@dataclass
class StepLedger:
    """Counts samples in and out of a step: kept, dropped (by reason), returned to the buffer, failed."""

    entered: int = 0
    kept: int = 0
    returned: int = 0
    failed: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    """One line per failed group: the first error, naming plugin, package and sample."""
    discarded: list[Group] = field(default_factory=list)
    """The dropped and failed groups, kept so the run can write them out."""
    produced: int = 0
    """Samples custom generators added beyond those they were given (slime's agents return several)."""
    requeued: int = 0
    """Failed samples whose prompts went back to the data source to be served again (counted as failed)."""
    _sizes: dict[int, int] = field(default_factory=dict, repr=False)

    def enter(self, groups: list[Group]) -> None:
        self.entered += sum(map(len, groups))
        for group in groups:
            self._sizes[id(group)] = len(group)

    def count_produced(self, group: Group) -> None:
        """Count the samples a generator added to ``group`` since it entered as entered too."""
        extra = len(group) - self._sizes.pop(id(group), len(group))
        if extra > 0:
            self.entered += extra
            self.produced += extra

    def keep(self, group: Group) -> None:
        self.kept += len(group)

    def drop(self, group: Group, reason: str) -> None:
        self.dropped[reason] += len(group)
        for sample in group:
            sample.metadata["drop_reason"] = reason
        self.discarded.append(group)

    def return_to_buffer(self, group: Group) -> None:
        self.returned += len(group)

    def fail(self, group: Group, error: str) -> None:
        self.failed += len(group)
        self.failures.append(error)
        self.discarded.append(group)

    def requeue(self, group: Group) -> None:
        """A failed group's prompt goes back to the data source: the failure stays counted."""
        self.requeued += len(group)

    @property
    def left(self) -> int:
        return self.kept + sum(self.dropped.values()) + self.returned + self.failed

    def check(self) -> None:
        """Raise when a sample went missing or was counted twice."""
        if self.left != self.entered:
            raise RlsdkError(
                f"ledger does not balance: {self.entered} samples entered, {self.left} left "
                f"(kept {self.kept}, dropped {dict(self.dropped)}, returned {self.returned}, failed {self.failed})"
            )

    def metrics(self) -> dict[str, Any]:
        metrics: dict[str, Any] = {
            "ledger/entered": self.entered,
            "ledger/produced": self.produced,
            "ledger/kept": self.kept,
            "ledger/returned": self.returned,
            "ledger/failed": self.failed,
            "ledger/requeued": self.requeued,
            "ledger/dropped": sum(self.dropped.values()),
        }
        metrics.update(
            {f"rollout/dynamic_filter/drop_{reason}": n for reason, n in sorted(self.dropped.items())}
        )
        return metrics


def audit_run(folder: str | Path) -> dict[str, int]:
    """Account for every sample a run's data source handed out (sample indices ``0..next_index-1``): each
    must be in ``rollouts.jsonl`` (kept), ``discarded.jsonl`` (dropped or failed) or the saved buffer.
    ``lost`` counts those found nowhere, ``duplicated`` those found twice."""
    import json

    folder = Path(folder)
    state = json.loads((folder / "state.json").read_text())["data"]
    seen: Counter[int] = Counter()
    for name in ("rollouts.jsonl", "discarded.jsonl"):
        path = folder / name
        if path.exists():
            seen.update(json.loads(line)["index"] for line in path.read_text().splitlines())
    seen.update(sample["index"] for group in state["buffer"] for sample in group)
    drawn = set(range(state["next_index"]))
    return {
        "drawn": len(drawn),
        "kept_or_discarded_or_buffered": len(seen),
        "lost": len(drawn - set(seen)),
        "duplicated": sum(n - 1 for n in seen.values() if n > 1),
    }
