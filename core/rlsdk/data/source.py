"""The data source: fresh groups from a dataset, a buffer served first, and state that resumes exactly."""

from __future__ import annotations

import json
import logging
import os
import random
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..config import RolloutConfig
from ..errors import DataError
from ..plugins.calls import call_buffer_filter
from ..plugins.manager import get_plugin_manager
from ..plugins.run_plugins import RunPlugins
from ..types import Sample
from .prompts import Prompt, PromptBuilder
from .rows import BadRowPolicy, DataPath, Row, read_rows
from ..plugins.kinds import BufferFilter

log = logging.getLogger("rlsdk.data")

STATE_VERSION = 1
START_ROLLOUT_ID = "start_rollout_id"
"""The metadata key recording the step in which a buffered group's generation started (slime's name)."""


class DataSource:
    """Groups of ``n_samples_per_prompt`` samples per prompt, buffered groups first.

    ``get_samples(n)`` asks the buffer filter (``args.buffer_filter_path``) for up to ``n`` buffered
    groups, then fills up with fresh prompts; the dataset is read in epochs, shuffled with the seed
    ``rollout_seed + epoch`` when ``rollout_shuffle`` is on. ``add_samples(groups)`` returns partial or
    surplus groups to the buffer. ``state_dict()`` holds the position and the buffered groups as JSON,
    so a resumed run serves exactly the groups an uninterrupted one would have::

        source = DataSource(args, tokenizer=tokenizer)
        groups = source.get_samples(4, rollout_id=0)
        source.add_samples(groups[2:])            # e.g. unfinished groups
        source.save("out/data_state.json")
        resumed = DataSource(args, tokenizer=tokenizer)
        resumed.load("out/data_state.json")        # serves groups[2:] first, then where we left off

    The whole file is read, templated, tokenized and filtered when the source is built, so an empty
    dataset or a bad row is an error before any engine starts. ``keep_messages`` keeps chat-message
    prompts as messages when no chat template is applied (for rollouts such as ``sft``). The buffer filter
    comes from the run's ``plugins`` (else from ``pm``'s, else the installed plugins, for ``args``);
    ``read`` hands over rows already read (with the policy that counted the bad ones).
    """

    def __init__(
        self,
        args: RolloutConfig,
        *,
        pm: Any = None,
        plugins: RunPlugins | None = None,
        tokenizer: Any = None,
        path: str | Path | None = None,
        n_samples_per_prompt: int | None = None,
        shuffle: bool | None = None,
        keep_messages: bool = False,
        read: tuple[list[Row], BadRowPolicy] | None = None,
    ) -> None:
        self.args = args
        spec = path if path is not None else args.prompt_data
        self.data_path = DataPath.parse(spec) if spec else None
        """None: no dataset (slime's data source without ``prompt_data``): groups of empty samples, for a
        generator that makes its own prompts, and the buffer."""
        self.n_samples_per_prompt = n_samples_per_prompt or args.n_samples_per_prompt
        self.shuffle = args.rollout_shuffle if shuffle is None else shuffle
        self.seed = args.rollout_seed

        if read is not None:
            rows, bad = read
        else:
            bad = BadRowPolicy(args.on_bad_row)
            rows = read_rows(self.data_path, bad) if self.data_path is not None else []
        rows_read = len(rows) + bad.skipped
        folder = self.data_path.path.parent if self.data_path is not None else Path.cwd()
        builder = PromptBuilder(args, tokenizer, bad, folder=folder, keep_messages=keep_messages)
        self.prompts: list[Prompt] = builder.build(rows)
        self._load_counts = {
            "rows_read": rows_read,
            "bad_rows_skipped": bad.skipped,
            "prompts_too_long": builder.too_long,
        }
        if not self.prompts and self.data_path is not None:
            raise DataError(f"{self.data_path}: no usable prompts ({self._describe_counts()})")
        log.info("%s: %d prompts (%s)", self.data_path, len(self.prompts), self._describe_counts())

        # buffer_filter: the run's, or (a data source outside a run) resolved from ``pm`` or the installed plugins
        self._buffer_filter = (
            plugins.one(BufferFilter)
            if plugins is not None
            else (pm or get_plugin_manager()).resolve(BufferFilter.kind, BufferFilter.chosen(args))
        )
        self.buffer: list[list[Sample]] = []
        self._epoch = 0
        self._offset = 0
        self._order = self._epoch_order(0)
        self._next_group_index = 0
        self._next_index = 0
        self._last_rollout_id = 0
        self.buffer_dropped: list[tuple[list[Sample], str]] = []
        """Groups the buffer filter dropped, not yet accounted for by a step (see :meth:`pop_buffer_dropped`)."""
        self._counters = {
            "groups_served_fresh": 0,
            "groups_served_from_buffer": 0,
            "buffer_groups_dropped": 0,
        }

    @property
    def has_images(self) -> bool:
        """Whether any prompt carries images (the engine's model must take them)."""
        return any(p.images for p in self.prompts)

    def __len__(self) -> int:
        """The number of usable prompts in the dataset."""
        return len(self.prompts)

    # ----- serving --------------------------------------------------------------------------------

    def get_samples(self, num_groups: int, rollout_id: int = 0) -> list[list[Sample]]:
        """``num_groups`` groups: buffered ones chosen by the buffer filter, then fresh ones."""
        if num_groups < 0:
            raise ValueError(f"num_groups must be at least 0, got {num_groups}")
        self._last_rollout_id = rollout_id
        groups = self._take_from_buffer(num_groups, rollout_id) if self.buffer and num_groups else []
        self._counters["groups_served_from_buffer"] += len(groups)
        fresh = [self._fresh_group() for _ in range(num_groups - len(groups))]
        self._counters["groups_served_fresh"] += len(fresh)
        return groups + fresh

    def add_samples(self, groups: list[list[Sample]], rollout_id: int | None = None) -> None:
        """Return groups to the buffer. Each sample's ``metadata["start_rollout_id"]`` records the step its
        generation started (kept if already set; else ``rollout_id``, else the last ``get_samples`` step)."""
        for position, group in enumerate(groups):
            if not isinstance(group, list) or not group or not all(isinstance(s, Sample) for s in group):
                raise TypeError(
                    f"add_samples: group {position} must be a non-empty list of Sample, got {group!r:.200}"
                )
        step = self._last_rollout_id if rollout_id is None else rollout_id
        for group in groups:
            for sample in group:
                if sample.metadata is None:
                    sample.metadata = {}
                sample.metadata.setdefault(START_ROLLOUT_ID, step)
            self.buffer.append(list(group))

    def get_buffer_length(self) -> int:
        """Groups waiting in the buffer (slime's name)."""
        return len(self.buffer)

    def iter_groups(self) -> Iterator[list[Sample]]:
        """Every prompt once, in epoch 0's order, as a group whose ``group_index`` is its position; for eval.
        Independent of ``get_samples`` and the buffer."""
        n = self.n_samples_per_prompt
        for position, prompt_index in enumerate(self._epoch_order(0)):
            prompt = self.prompts[prompt_index]
            yield [prompt.sample(position, position * n + i) for i in range(n)]

    def metrics(self) -> dict[str, int]:
        """Counters: rows read, bad rows skipped, prompts too long, prompts, epoch, buffer size, groups
        served fresh and from the buffer, buffered groups the buffer filter dropped."""
        return {
            **self._load_counts,
            "prompts": len(self.prompts),
            "epoch": self._epoch,
            "buffer_size": len(self.buffer),
            **self._counters,
        }

    def _fresh_group(self) -> list[Sample]:
        if self.data_path is None:
            return self._empty_group()
        if self._offset >= len(self._order):
            self._epoch += 1
            self._offset = 0
            self._order = self._epoch_order(self._epoch)
        prompt = self.prompts[self._order[self._offset]]
        self._offset += 1
        group_index = self._next_group_index
        self._next_group_index += 1
        first = self._next_index
        self._next_index += self.n_samples_per_prompt
        return [prompt.sample(group_index, first + i) for i in range(self.n_samples_per_prompt)]

    def _empty_group(self) -> list[Sample]:
        group_index, first = self._next_group_index, self._next_index
        self._next_group_index += 1
        self._next_index += self.n_samples_per_prompt
        return [Sample(group_index=group_index, index=first + i) for i in range(self.n_samples_per_prompt)]

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def _take_from_buffer(self, num_groups: int, rollout_id: int) -> list[list[Sample]]:
        """The buffer filter's choice, checked before the buffer changes (buffer_filter)."""
        resolved = self._buffer_filter
        taken, left = call_buffer_filter(resolved, self.args, rollout_id, self.buffer, num_groups)
        still = {id(g) for g in (*taken, *left)}
        dropped = [g for g in self.buffer if id(g) not in still]
        if dropped:
            log.info(
                "%s dropped %d buffered groups at rollout %d", resolved.describe(), len(dropped), rollout_id
            )
            reason = f"buffer_filter_{resolved.name}"
            self.buffer_dropped += [(g, reason) for g in dropped]
        self._counters["buffer_groups_dropped"] += len(dropped)
        self.buffer = left
        return taken

    def pop_buffer_dropped(self) -> list[tuple[list[Sample], str]]:
        """The buffered groups the buffer filter dropped since the last call, each with its drop reason
        (``buffer_filter_<name>``), for the step to account for and write out."""
        dropped, self.buffer_dropped = self.buffer_dropped, []
        return dropped

    # ----- state ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """A JSON-safe snapshot: epoch, offset, the group/sample counters, counters and buffered groups."""
        state = {
            "version": STATE_VERSION,
            "data": str(self.data_path),
            "num_prompts": len(self.prompts),
            "shuffle": self.shuffle,
            "seed": self.seed,
            "epoch": self._epoch,
            "offset": self._offset,
            "next_group_index": self._next_group_index,
            "next_index": self._next_index,
            "last_rollout_id": self._last_rollout_id,
            "counters": dict(self._counters),
            "buffer": [[sample.to_dict() for sample in group] for group in self.buffer],
        }
        try:
            return json.loads(json.dumps(state))
        except (TypeError, ValueError) as exc:
            raise DataError(
                f"the data source state is not JSON-safe (check buffered samples' metadata): {exc}"
            ) from exc

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()``; the dataset and options should be those of the saved run."""
        if state.get("version") != STATE_VERSION:
            raise DataError(f"data source state version {state.get('version')!r} is not {STATE_VERSION}")
        for key, now in (("num_prompts", len(self.prompts)), ("shuffle", self.shuffle), ("seed", self.seed)):
            if state[key] != now:
                warnings.warn(
                    f"resuming data from {state['data']} with {key}={state[key]!r}, but now {key}={now!r}: "
                    f"the order of prompts will differ from the saved run",
                    stacklevel=2,
                )
        buffer = [[Sample.from_dict(sample) for sample in group] for group in state["buffer"]]
        self._epoch = state["epoch"]
        self._order = self._epoch_order(self._epoch)
        self._offset = min(state["offset"], len(self._order))
        self._next_group_index = state["next_group_index"]
        self._next_index = state["next_index"]
        self._last_rollout_id = state["last_rollout_id"]
        self._counters = dict(state["counters"])
        self.buffer = buffer

    def save(self, path: str | Path) -> None:
        """Write ``state_dict()`` as JSON, atomically (a crash mid-write keeps the old file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.state_dict())
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise

    def load(self, path: str | Path) -> None:
        """Restore the state written by ``save(path)``."""
        self.load_state_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def _describe_counts(self) -> str:
        counts = self._load_counts
        return (
            f"{counts['rows_read']} rows read, {counts['bad_rows_skipped']} bad rows skipped, "
            f"{counts['prompts_too_long']} prompts longer than rollout_max_prompt_len"
        )
