"""A step's kept samples as training tensors, cut into global and micro batches."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..types import Sample, policy_versions


@dataclass
class TrainSample:
    """One sample's tensors: every token, the response's loss mask and rollout log-probs."""

    tokens: torch.Tensor
    response_length: int
    loss_mask: torch.Tensor
    rollout_log_probs: torch.Tensor | None
    reward: float
    current_policy: bool = True
    """Whether the step's newest weights sampled all of it (False: a sample continued after a weight sync,
    or kept from a step before): the sampler-trainer log-prob gap is measured on the others only."""

    @property
    def total_length(self) -> int:
        return int(self.tokens.numel())

    @classmethod
    def from_sample(cls, sample: Sample, reward: float, newest: int | None = None) -> TrainSample:
        """``newest``: the newest policy version that sampled any of the step's samples (None: unknown)."""
        n = sample.response_length
        if n >= len(sample.tokens):
            raise ValueError(
                f"sample {sample.group_index}/{sample.index}: response_length {n} leaves no prompt token "
                f"among its {len(sample.tokens)} tokens (the first response token is predicted from one)"
            )
        mask = sample.loss_mask if sample.loss_mask is not None else [1] * n
        if sample.remove_sample:  # a rollout_sample_filter left it out of the loss (its reward still counted)
            mask = [0] * n
        logps = sample.rollout_log_probs
        if len(mask) != n or (logps is not None and len(logps) != n):
            raise ValueError(
                f"sample {sample.group_index}/{sample.index}: loss_mask and rollout_log_probs "
                f"must have response_length ({n}) entries"
            )
        return cls(
            tokens=torch.tensor(sample.tokens, dtype=torch.long),
            response_length=n,
            loss_mask=torch.tensor(mask, dtype=torch.float32),
            rollout_log_probs=None if logps is None else torch.tensor(logps, dtype=torch.float32),
            reward=reward,
            current_policy=policy_versions(sample) <= {newest} if newest is not None else True,
        )


def newest_version(samples: list[Sample]) -> int | None:
    """The newest policy version that sampled any of ``samples``: in a run that syncs before each step's
    rollouts, the version the trainer holds when it trains on them."""
    return max((v for s in samples for v in policy_versions(s)), default=None)


def slices(count: int, size: int) -> Iterator[slice]:
    for start in range(0, count, size):
        yield slice(start, min(start + size, count))


def micro_batches(
    samples: list[TrainSample], micro_batch_size: int, max_tokens: int | None = None
) -> list[list[int]]:
    """Indices of each micro-batch, in order: ``micro_batch_size`` samples, or with ``max_tokens`` as many
    as fit that many padded tokens (a longer sample goes alone)."""
    if max_tokens is None:
        return [list(range(s.start, s.stop)) for s in slices(len(samples), micro_batch_size)]
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, sample in enumerate(samples):
        longest_with = max(longest, sample.total_length)
        if current and longest_with * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest_with = [], sample.total_length
        current.append(i)
        longest = longest_with
    if current:
        batches.append(current)
    return batches


def response_rows(total_lengths: list[int], response_lengths: list[int]) -> torch.Tensor:
    """The rows of packed logits (``[sum(total_lengths)]``) that predict each sample's response tokens, in
    order: ``[sum(response_lengths)]``."""
    rows, offset = [], 0
    for total, response in zip(total_lengths, response_lengths, strict=True):
        rows.append(torch.arange(offset + total - response - 1, offset + total - 1))
        offset += total
    return torch.cat(rows)


def loss_batch(
    samples: list[TrainSample],
    indices: list[int],
    per_sample: dict[str, list[Any]],
    device: torch.device | None = None,
) -> dict[str, Any]:
    """A micro-batch in slime's shape: lists with one entry per sample, its tensors on ``device`` (the
    logits' device; default where they are)."""
    batch: dict[str, Any] = {
        "unconcat_tokens": [samples[i].tokens for i in indices],
        "total_lengths": [samples[i].total_length for i in indices],
        "response_lengths": [samples[i].response_length for i in indices],
        "loss_masks": [samples[i].loss_mask for i in indices],
        "rewards": [samples[i].reward for i in indices],
        "current_policy": [samples[i].current_policy for i in indices],
    }
    rollout = [samples[i].rollout_log_probs for i in indices]
    batch["rollout_log_probs"] = rollout if all(r is not None for r in rollout) else []
    for key, values in per_sample.items():
        batch[key] = [values[i] for i in indices] if values else []
    if device is not None:
        for key, values in batch.items():
            if isinstance(values, list):
                batch[key] = [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]
    return batch


@dataclass
class SharedPrompts:
    """A micro-batch laid out with each distinct prompt once: a row holds one prompt followed by every
    response to it, each response attending to the prompt and to itself only (a 4D mask, positions that
    restart after the prompt). A group of n samples then costs one prompt instead of n.

    ``gather`` indexes the flattened ``[rows * length]`` outputs into the packed order of the samples
    (each sample's prompt positions, then its response positions), which is what slime's losses read.
    ``keep`` are the positions (in any row) that predict a response token, and ``response_gather`` indexes
    the flattened ``[rows * len(keep)]`` outputs at those positions into the samples' order: the rows a
    ``response`` loss reads, with no vocabulary projection of other positions."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    gather: torch.Tensor
    keep: torch.Tensor
    response_gather: torch.Tensor

    @classmethod
    def build(
        cls,
        samples: list[TrainSample],
        indices: list[int],
        dtype: torch.dtype = torch.float32,
        pad_id: int = 0,
    ) -> SharedPrompts:
        rows: dict[tuple[int, ...], list[int]] = {}
        for i in indices:
            sample = samples[i]
            rows.setdefault(
                tuple(sample.tokens[: sample.total_length - sample.response_length].tolist()), []
            ).append(i)
        longest = max(
            len(p) + sum(samples[i].response_length for i in members) for p, members in rows.items()
        )
        ids = torch.full((len(rows), longest), pad_id, dtype=torch.long)
        positions = torch.zeros((len(rows), longest), dtype=torch.long)
        segment = torch.full((len(rows), longest), -1, dtype=torch.long)  # -1 padding, 0 prompt, k response k
        where: dict[int, torch.Tensor] = {}
        predicting: dict[int, tuple[int, torch.Tensor]] = {}  # sample -> (row, positions predicting it)
        for row, (prompt, members) in enumerate(rows.items()):
            p = len(prompt)
            ids[row, :p] = torch.tensor(prompt, dtype=torch.long)
            positions[row, :p] = torch.arange(p)
            segment[row, :p] = 0
            start = p
            for k, i in enumerate(members, start=1):
                n = samples[i].response_length
                ids[row, start : start + n] = samples[i].tokens[p:]
                positions[row, start : start + n] = torch.arange(p, p + n)
                segment[row, start : start + n] = k
                flat = row * longest
                where[i] = torch.cat(
                    [torch.arange(flat, flat + p), torch.arange(flat + start, flat + start + n)]
                )
                at = torch.arange(start - 1, start + n - 1)  # each response token's predecessor...
                at[:1] = p - 1  # ...the first one's being the prompt's last token
                predicting[i] = (row, at)
                start += n
        causal = torch.ones(longest, longest, dtype=torch.bool).tril()
        same = (segment[:, :, None] == segment[:, None, :]) | (segment[:, None, :] == 0)
        allowed = causal & same & (segment[:, None, :] >= 0)
        allowed |= torch.eye(longest, dtype=torch.bool)  # padding rows attend to themselves: no NaN rows
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
        keep = torch.cat([at for _, at in predicting.values()]).unique()  # sorted
        column = torch.full((longest,), -1, dtype=torch.long)
        column[keep] = torch.arange(len(keep))
        response_gather = torch.cat(
            [predicting[i][0] * len(keep) + column[predicting[i][1]] for i in indices]
        )
        return cls(
            ids, positions, mask[:, None], torch.cat([where[i] for i in indices]), keep, response_gather
        )
