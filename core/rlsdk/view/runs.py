"""A run folder as the viewer reads it: never written, re-read as the run writes it.

Each page's data comes from here: the run (settings, plugins, the health of its files, curves, evals),
a step (groups, rewards, filter verdicts, discarded groups, timings, policy versions), samples (found by
step, reward, length, status, reason, dataset or text, a page at a time), one sample, and two evals side
by side. The sample files are indexed by byte offset (:mod:`.index`), so a page reads only the lines it
shows.
"""

from __future__ import annotations

import json
import math
import os
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..outputs import (
    DISCARDED_FILE,
    EVAL_FILE,
    EVAL_SAMPLES_FILE,
    LOCK_FILE,
    METRICS_FILE,
    ROLLOUTS_FILE,
    STATE_FILE,
    TRAIN_LOG_PROBS,
)
from ..locks import read_holder
from .index import JsonlIndex
from .samples import Filters, SampleFile, preview, prompt_preview
from .tokens import TokenText

SAMPLE_FILES = {"rollouts": ROLLOUTS_FILE, "discarded": DISCARDED_FILE, "eval": EVAL_SAMPLES_FILE}
"""The sample files, by the name pages use: kept samples, dropped and failed ones, eval samples."""
RUN_FILES = (STATE_FILE, METRICS_FILE, ROLLOUTS_FILE)
"""A folder holding one of these is a run folder."""


class ViewError(ValueError):
    """A request the run cannot answer (a step, sample or dataset it does not have): the page says why."""


def find_runs(folders: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The run folders named on the command line; a folder that holds no run but whose sub-folders do
    stands for them. A name that is neither is an error naming it."""
    runs: list[Path] = []
    for given in folders:
        folder = Path(given).expanduser().resolve()
        if not folder.is_dir():
            raise ViewError(f"{given}: no such folder")
        if is_run(folder):
            runs.append(folder)
            continue
        inside = sorted(p for p in folder.iterdir() if p.is_dir() and is_run(p))
        if not inside:
            raise ViewError(
                f"{given} is not a run folder: it holds none of {', '.join(RUN_FILES)}, nor do its sub-folders"
            )
        runs += inside
    return list(dict.fromkeys(runs))


def is_run(folder: Path) -> bool:
    return any((folder / name).exists() for name in RUN_FILES)


def numbers(row: dict[str, Any]) -> dict[str, int | float]:
    """A metrics row's finite numbers (curves plot only these)."""
    return {
        k: v
        for k, v in row.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


class RowLog:
    """A small JSONL file kept parsed in memory (``metrics.jsonl``, ``eval.jsonl``: a row per step)."""

    def __init__(self, path: Path) -> None:
        self.rows: list[dict[str, Any]] = []
        self.index = JsonlIndex(path, lambda row, line: {}, ints=())

    def refresh(self) -> None:
        if self.index.refresh():
            if len(self.rows) > len(self.index):
                self.rows = []
            new = range(len(self.rows), len(self.index))
            self.rows += [row or {} for row in self.index.read_many(new)]


def run_status(folder: Path, state: dict[str, Any] | None) -> str:
    """``running`` while a run holds the folder's lock, else ``finished`` (every step done), ``stopped``
    (fewer) or ``not started`` (no state)."""
    if running(folder):
        return "running"
    if state is None:
        return "not started"
    steps = (state.get("settings") or {}).get("num_rollout")
    done = state.get("next_rollout_id", 0)
    return "finished" if isinstance(steps, int) and done >= steps else "stopped"


def running(folder: Path) -> bool:
    """Whether a run holds ``folder``'s lock, read from ``/proc/locks`` (the lock file's inode), so the
    viewer never takes the lock itself; where that cannot be read, whether the pid in it is alive."""
    lock = folder / LOCK_FILE
    try:
        stat = lock.stat()
    except OSError:
        return False
    try:
        with open("/proc/locks") as locks:  # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"
            for line in locks:
                fields = line.split()
                if len(fields) > 5 and fields[1] == "FLOCK" and fields[5].endswith(f":{stat.st_ino}"):
                    return True
            return False
    except OSError:
        pass
    try:
        pid = read_holder(lock.read_text()).get("pid")
        if isinstance(pid, int) and pid > 0:
            os.kill(pid, 0)
            return True
    except (OSError, ValueError):
        pass
    return False


class RunFolder:
    """One run folder, read as it is written (see the module's docstring)."""

    def __init__(self, folder: Path, number: int, tokenizer: str | None = None) -> None:
        self.folder, self.number = folder, number
        self.name = folder.name
        self._tokenizer_path = tokenizer
        self._state_stamp: tuple[int, int] | None = None
        self.state: dict[str, Any] | None = None
        self.state_error: str | None = None
        self._read_state()
        settings = self.settings
        self.reward_key = settings.get("reward_key")
        self.metrics = RowLog(folder / METRICS_FILE)
        self.evals = RowLog(folder / EVAL_FILE)
        keys = {"eval": settings.get("eval_reward_key") or self.reward_key}  # an eval's rewards: its own key
        self.samples = {
            name: SampleFile(folder / file, keys.get(name, self.reward_key))
            for name, file in SAMPLE_FILES.items()
        }
        self.tokens: TokenText | None = None

    @property
    def settings(self) -> dict[str, Any]:
        return dict((self.state or {}).get("settings") or {})

    def _read_state(self) -> None:
        path = self.folder / STATE_FILE
        try:
            stat = path.stat()
        except OSError:
            self.state, self._state_stamp = None, None
            return
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._state_stamp:
            return
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(state, dict):
                raise ValueError("not a JSON object")
            self.state, self.state_error = state, None
        except (OSError, ValueError) as exc:
            self.state_error = f"{STATE_FILE} cannot be read ({exc})"
        self._state_stamp = stamp

    def refresh(self) -> None:
        """Read what the run wrote since the last call."""
        self._read_state()
        self.metrics.refresh()
        self.evals.refresh()
        for file in self.samples.values():
            file.refresh()

    def token_text(self) -> TokenText:
        if self.tokens is None:
            settings = self.settings
            given = self._tokenizer_path
            self.tokens = TokenText.load(given or settings.get("hf_checkpoint") or settings.get("model"))
        return self.tokens

    def sample_file(self, name: str) -> SampleFile:
        if name not in self.samples:
            raise ViewError(f"no sample file {name!r}: one of {', '.join(self.samples)}")
        return self.samples[name]

    # ------------------------------------------------------------------ the run

    def overview(self) -> dict[str, Any]:
        """What the list of runs shows of this one."""
        state = self.state or {}
        last = self.metrics.rows[-1] if self.metrics.rows else {}
        return {
            "id": self.number,
            "name": self.name,
            "path": str(self.folder),
            "status": run_status(self.folder, self.state),
            "steps": len(self.metrics.rows),
            "num_rollout": self.settings.get("num_rollout"),
            "next_step": state.get("next_rollout_id"),
            "samples": {name: len(f.index) for name, f in self.samples.items()},
            "reward": last.get("rollout/reward_mean"),
        }

    def summary(self) -> dict[str, Any]:
        """The run page's header: settings, plugins with versions, its files and their health."""
        state = self.state or {}
        checkpoints = self.folder / "checkpoints"
        return {
            **self.overview(),
            "settings": self.settings,
            "plugins": state.get("plugins") or {},
            "checkpoint": state.get("checkpoint"),
            "checkpoints": sorted(p.name for p in checkpoints.iterdir() if p.is_dir())
            if checkpoints.is_dir()
            else [],
            "files": self.files(),
            "notes": self.notes(),
            "eval_datasets": self.eval_datasets(),
            "eval_steps": sorted(
                {r["rollout_id"] for r in self.evals.rows if isinstance(r.get("rollout_id"), int)}
            ),
        }

    def files(self) -> list[dict[str, Any]]:
        saved = (self.state or {}).get("file_sizes") or {}
        logs: list[tuple[str, JsonlIndex]] = [
            (METRICS_FILE, self.metrics.index),
            (EVAL_FILE, self.evals.index),
        ]
        logs += [(SAMPLE_FILES[name], f.index) for name, f in self.samples.items()]
        out = []
        for name, index in logs:
            past = 0
            if isinstance(saved.get(name), int):
                past = len(index) - _lines_before(index, saved[name])
            out.append(
                {
                    "name": name,
                    "lines": len(index),
                    "bytes": index.end + index.partial,
                    "partial_bytes": index.partial,
                    "bad_lines": len(index.bad_lines),
                    "past_saved_state": past,
                }
            )
        return out

    def notes(self) -> list[str]:
        """What a reader should know about the files: lines being written or cut, lines that are not JSON,
        rows past the saved state, steps with samples but no metrics."""
        notes = []
        if self.state is None:
            notes.append(self.state_error or f"no {STATE_FILE}: the run has not saved its state yet")
        status = run_status(self.folder, self.state)
        for file in self.files():
            name = file["name"]
            if file["partial_bytes"]:
                what = "being written" if status == "running" else "cut short (a crash?)"
                notes.append(f"{name} ends with {file['partial_bytes']} bytes of a line {what}: not shown")
            if file["bad_lines"]:
                notes.append(f"{name}: {file['bad_lines']} lines are not JSON objects (shown as damaged)")
            if file["past_saved_state"] > 0:
                if status == "running":
                    why = "steps since the state was last saved; a training run saves it with each checkpoint"
                else:
                    why = "--resume drops them and runs those steps again"
                notes.append(
                    f"{name}: {file['past_saved_state']} lines written after the saved state ({why})"
                )
        metric_steps = {r.get("rollout_id") for r in self.metrics.rows}
        missing = sorted(s for s in self.samples["rollouts"].steps if s not in metric_steps)
        if missing:
            shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
            notes.append(f"steps with samples but no metrics row: {shown}")
        return notes

    def steps(self) -> list[int]:
        """The steps with a metrics row, in order."""
        return sorted(r["rollout_id"] for r in self.metrics.rows if isinstance(r.get("rollout_id"), int))

    def metric_rows(self, since: int = 0) -> dict[str, Any]:
        """Each step's numeric metrics from row ``since`` on (a live page asks only for new rows)."""
        rows = self.metrics.rows
        return {"rows": [numbers(r) for r in rows[since:]], "next": len(rows)}

    def eval_datasets(self) -> list[str]:
        names: dict[str, None] = {}
        for row in self.evals.rows:
            for key in row:
                parts = key.split("/")
                if len(parts) >= 3 and parts[0] == "eval" and parts[-1] == "reward_mean":
                    names["/".join(parts[1:-1])] = None
        return list(names)

    def eval_rows(self) -> dict[str, Any]:
        return {"rows": [numbers(r) for r in self.evals.rows], "datasets": self.eval_datasets()}

    # ------------------------------------------------------------------ a step

    def step(self, step: int, group_offset: int = 0, group_limit: int = 50) -> dict[str, Any]:
        """Step ``step``: its metrics row, its kept groups (each sample's reward, length, status), its
        discarded samples by reason, the policy versions its samples were sampled under, its eval."""
        row = next((r for r in self.metrics.rows if r.get("rollout_id") == step), None)
        kept = self.samples["rollouts"]
        lines = kept.steps.get(step, [])
        discarded = self.samples["discarded"]
        dropped = discarded.steps.get(step, [])
        if row is None and not lines and not dropped:
            raise ViewError(f"step {step} is not in this run (steps: {_ranges(self.steps()) or 'none yet'})")
        groups = _groups(kept, lines)
        shown = groups[group_offset : group_offset + group_limit]
        firsts = [g["lines"][0] for g in shown]
        for group, first in zip(shown, kept.index.read_many(firsts), strict=True):
            group["prompt"] = prompt_preview((first or {}).get("prompt"))
            group["label"] = preview((first or {}).get("label"))
        reasons: dict[str, list[dict[str, Any]]] = {}
        for group in _groups(discarded, dropped):
            reason = discarded.index.string_value("reason", group["lines"][0]) or "unknown"
            reasons.setdefault(reason, []).append(group)
        versions: Counter[str] = Counter()
        for first in kept.index.read_many(lines[:: max(1, len(lines) // 64)]):  # a sample of them
            for version in set((first or {}).get("weight_versions") or []):
                versions[str(version)] += 1
        evaluated = next((r for r in self.evals.rows if r.get("rollout_id") == step), None)
        steps = self.steps()
        position = steps.index(step) if step in steps else None
        return {
            "step": step,
            "metrics": row,
            "eval": evaluated,
            "groups": shown,
            "group_count": len(groups),
            "group_offset": group_offset,
            "discarded": [{"reason": r, "groups": g} for r, g in sorted(reasons.items())],
            "versions": dict(versions),
            "previous": steps[position - 1] if position else None,
            "next": steps[position + 1] if position is not None and position + 1 < len(steps) else None,
        }

    # ------------------------------------------------------------------ samples

    def search(
        self, file: str, filters: Filters, order: str = "order", offset: int = 0, limit: int = 50
    ) -> dict[str, Any]:
        samples = self.sample_file(file)
        lines = samples.sort(samples.lines(filters), order)
        index = samples.index
        return {
            "file": file,
            "total": len(lines),
            "offset": offset,
            "rows": samples.summaries(lines[offset : offset + limit]),
            "facets": {name: list(index.codes[name].names) for name in ("status", "reason", "dataset")},
            "steps": sorted(samples.steps),
        }

    def sample(self, file: str, n: int) -> dict[str, Any]:
        """One sample's whole row, its tokens as text where the run's tokenizer can be read, and its
        neighbours in the same step."""
        samples = self.sample_file(file)
        if not 0 <= n < len(samples.index):
            raise ViewError(f"{SAMPLE_FILES[file]} has {len(samples.index)} lines; no line {n}")
        row = samples.index.read(n)
        if row is None:
            return {"file": file, "n": n, "row": None, "values": samples.shown_values(n)}
        tokens = self.token_text()
        response_length = row.get("response_length") or 0
        ids = row.get("tokens") or []
        trained = (row.get("metadata") or {}).get(TRAIN_LOG_PROBS)
        same_step = samples.steps.get(samples.index.ints["step"][n], [])  # keyed by the column's value
        position = same_step.index(n) if n in same_step else None
        agent = (row.get("metadata") or {}).get("agent")
        tree = agent.get("tree") if isinstance(agent, dict) else None
        return {
            "file": file,
            "n": n,
            "row": row,
            "values": samples.shown_values(n),
            "prompt_length": max(len(ids) - response_length, 0),
            "pieces": tokens.pieces(ids),
            "train_log_probs": trained if isinstance(trained, list) else None,
            "tree_pieces": [tokens.pieces(node.get("tokens") or []) for node in tree.get("nodes", [])]
            if isinstance(tree, dict)
            else None,
            "tokenizer": tokens.describe(),
            "previous": same_step[position - 1] if position else None,
            "next": same_step[position + 1]
            if position is not None and position + 1 < len(same_step)
            else None,
        }


def _lines_before(index: JsonlIndex, size: int) -> int:
    """How many indexed lines start within the first ``size`` bytes."""
    return bisect_left(index.offsets, size)


def _groups(samples: SampleFile, lines: list[int]) -> list[dict[str, Any]]:
    """``lines`` by group, in the order groups first appear: each with its samples' values, reward mean and
    spread."""
    groups: dict[Any, dict[str, Any]] = {}
    index = samples.index
    for n in lines:
        key = index.int_value("group", n)
        group = groups.setdefault(key, {"group": key, "lines": [], "samples": []})
        group["lines"].append(n)
        group["samples"].append({"n": n, **samples.shown_values(n)})
    for group in groups.values():
        rewards = [s["reward"] for s in group["samples"] if s["reward"] is not None]
        mean = sum(rewards) / len(rewards) if rewards else None
        group["reward_mean"] = mean
        group["reward_std"] = (
            math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) if mean is not None else None
        )
    return list(groups.values())


def _ranges(values: list[int]) -> str:
    """``0..4, 7``: sorted integers as ranges."""
    spans: list[list[int]] = []
    for v in values:
        if spans and v == spans[-1][1] + 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in spans)
