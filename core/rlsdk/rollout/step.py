"""The ``sglang`` rollout step: slime's over-sampling algorithm, top-down, with its gaps closed.

One step pulls groups in chunks, generates them under a concurrency bound, rewards each finished
group, applies the dynamic filter, stops at ``rollout_batch_size`` kept groups, aborts the rest and
returns every unfinished or surplus group to the buffer. Each sample that enters a step leaves it in
the ledger as kept, dropped (with a reason), returned to the buffer, or failed (with its error).
"""

from __future__ import annotations

import asyncio
import copy
import math
import time
import warnings
from typing import Any

from ..agents.sessions import agent_metrics
from ..config import RolloutConfig
from ..aio.concurrency import ConcurrencyLimit
from ..errors import PluginCallError
from ..plugins.calls import (
    ENGINE_FAULT,
    FINISHED,
    call_all_samples_process,
    call_dynamic_filter,
    call_rollout_sample_filter,
    call_over_sampling_filter,
    unfinished,
)
from ..plugins.run_plugins import RunPlugins
from ..runtime import Runtime, get_runtime
from ..types import RolloutFnTrainOutput, Sample, reward_value
from .evaluation import eval_rollout
from .generate import sampling_params_for
from .groups import run_group
from .ledger import Group, StepLedger
from .rewarding import apply_invalid_policy, count_invalid, invalid_reward_causes, rubric_metrics

SUBMIT_SLICE = 64
"""Samples whose tasks a step creates before it lets them run (and send their requests) while it goes on
creating the rest of a chunk."""
MAX_ENGINE_REQUEUES = 3
"""Times the prompt of a group the engine failed goes back to the data source; the next failure uses it up,
so a prompt that breaks the engine every time is not served forever."""
ENGINE_REQUEUES = "engine_requeues"
"""Metadata key: how many times the sample's prompt came back after the engine failed its group."""


def generate_rollout(args: RolloutConfig, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's ``generate_rollout`` signature: run one training step (or eval) on the run's engine."""
    runtime = get_runtime(args)
    if evaluation:
        return runtime.run(eval_rollout(args, runtime))
    return runtime.run(rollout_step(args, rollout_id, data_source, runtime))


async def rollout_step(
    args: RolloutConfig, rollout_id: int, data_source: Any, runtime: Runtime
) -> RolloutFnTrainOutput:
    """One training step, readable top to bottom."""
    started = time.perf_counter()
    plugins = runtime.plugins
    ledger = StepLedger()
    target = args.rollout_batch_size
    max_groups = args.rollout_max_groups_per_step or 8 * target
    limit = ConcurrencyLimit(args.sglang_server_concurrency)
    sampling_params = sampling_params_for(args)

    kept: list[Group] = []
    fallback: list[tuple[Group, str]] = []  # dropped, but DynamicFilterOutput.keep_when_insufficient
    to_buffer: list[Group] = []  # unfinished: resumed from their tokens with partial rollouts
    restarted: list[Group] = []  # hung past the abort timeout: their state is unknown, start over
    in_flight: dict[asyncio.Task[Group], Group] = {}
    entry_metadata: dict[int, dict[str, Any]] = {}  # id(sample) -> its metadata entering the step, if any
    finished = (
        asyncio.Event()
    )  # set as a task ends: cheaper than asyncio.wait, which hooks every task per call
    pulled, exhausted = 0, False
    settled, unusable = 0, 0  # groups decided; of them, those with no sample that could be trained on
    hopeless = False

    stop = runtime.stop  # SIGTERM or SIGINT: abort what is in flight, every group back to the buffer
    with stop.watch(finished):
        while len(kept) < target and not stop.is_set:
            hopeless = unusable >= target and unusable == settled and not fallback
            if hopeless:
                break  # a reward or an engine that fails everything: pulling more data would only use it up
            # Keep enough groups in flight to fill the batch, pulling a chunk at a time.
            if not exhausted and pulled < max_groups and len(kept) + len(in_flight) < target:
                chunk = min(args.over_sampling_batch_size or target, max_groups - pulled)
                groups = data_source.get_samples(chunk, rollout_id)  # buffer_filter: buffered groups first
                exhausted = not groups
                ledger.enter(groups)
                entry_metadata.update((id(s), dict(s.metadata)) for g in groups for s in g if s.metadata)
                pulled += len(groups)
                unsent = 0
                for group in groups:
                    task = asyncio.create_task(
                        run_group(args, plugins, group, sampling_params, limit, rollout_id=rollout_id)
                    )
                    task.add_done_callback(lambda _: finished.set())
                    in_flight[task] = group
                    unsent += len(group)
                    # let these start: the engine gets a chunk's first requests early
                    if unsent >= SUBMIT_SLICE:
                        unsent = 0
                        await asyncio.sleep(0)
            if not in_flight:
                break
            await finished.wait()
            finished.clear()
            for task in [t for t in in_flight if t.done()]:  # in submission order: reproducible batches
                group = in_flight.pop(task)
                task.result()  # run_group records failures on the samples; only a `fail` policy raises
                ledger.count_produced(group)
                await settle(args, plugins, group, ledger, kept, fallback, to_buffer)
                settled += 1
                unusable += all(s.status == Sample.Status.FAILED for s in group)
                runtime.report_progress(len(group))

    # Abort what is still in flight: finished groups are settled, unfinished ones go to the buffer.
    if in_flight:
        await runtime.engine.abort()  # engine: abort every request in flight
        done, hung = await asyncio.wait(in_flight, timeout=args.abort_timeout)
        for task in hung:
            task.cancel()
        await asyncio.gather(*hung, return_exceptions=True)
        for task, group in in_flight.items():
            if task in done and not task.cancelled():
                task.result()
                ledger.count_produced(group)
                await settle(args, plugins, group, ledger, kept, fallback, to_buffer)
            else:
                restarted.append(
                    reset_for_buffer(args, group, rollout_id, partial=False, metadata=entry_metadata)
                )

    stopped = stop.is_set
    if stopped:  # the run stops: nothing is trained now, every group waits in the buffer for --resume
        to_buffer += kept + [group for group, _ in fallback]
        kept, fallback = [], []

    # Not enough groups passed the dynamic filter: top up with groups it allowed as a fallback.
    for group, reason in fallback:
        if len(kept) < target:
            kept.append(group)
        else:
            ledger.drop(group, reason)

    # over_sampling_filter: order the kept groups; the first rollout_batch_size form the batch.
    if plugins.over_sampling_filter is not None:
        kept = await order_groups(args, plugins, kept, ledger)
    batch, surplus = kept[:target], kept[target:]
    for group in batch:
        ledger.keep(group)

    # Unfinished and surplus groups go back to the buffer, served first next step.
    aborted = sum(s.status not in FINISHED for g in (*to_buffer, *restarted) for s in g)
    keep_tokens = args.partial_rollout or stopped  # a stopped run resumes its samples where they stopped
    returned = [
        reset_for_buffer(args, g, rollout_id, partial=keep_tokens, metadata=entry_metadata) for g in to_buffer
    ]
    returned += restarted + surplus
    for group in returned:
        ledger.return_to_buffer(group)
    # Groups the engine failed stay failed, but their prompts go back too, in data order: no data used up.
    requeued = sorted((g for g in ledger.discarded if engine_failed(g)), key=lambda g: g[0].group_index or 0)
    for group in requeued:
        ledger.requeue(group)
    returned += [restart_group(args, g, rollout_id) for g in requeued]
    if returned:
        data_source.add_samples(returned, rollout_id)

    # buffer_filter drops: groups served back to no step, counted and written out with their reason
    for group, reason in getattr(data_source, "pop_buffer_dropped", list)():
        ledger.enter([group])
        ledger.drop(group, reason)
    ledger.check()
    removed = None
    if plugins.rollout_sample_filter is not None:  # rollout_sample_filter: mark samples out of the loss
        removed = call_rollout_sample_filter(args, plugins.rollout_sample_filter, batch)
    if plugins.all_samples_process is not None:  # all_samples_process: every finished group, kept or not
        finished_groups = sorted(
            [*batch, *ledger.discarded], key=lambda g: (g[0].group_index or 0) if g else 0
        )
        call_all_samples_process(args, plugins.all_samples_process, finished_groups, data_source)
    metrics = step_metrics(args, batch, ledger, started)
    if removed is not None:
        metrics["rollout/removed_samples"] = removed
    if len(batch) < target and not stopped:  # said, not silent: the trainer gets a smaller batch
        why = (
            f"the data ran out after {pulled} groups"
            if exhausted
            else f"no sample of the {unusable} groups it ran could be used, so it pulled no more"
            if hopeless
            else f"it pulled {pulled} groups, the cap (--set rollout_max_groups_per_step=N; default 8 x "
            f"rollout_batch_size)"
        )
        warnings.warn(
            f"step {rollout_id}: {len(batch)} of {target} groups ({sum(ledger.dropped.values())} "
            f"samples dropped, {ledger.failed} failed): {why}",
            RuntimeWarning,
            stacklevel=1,
        )
    metrics["rollout/short_of_batch"] = target - len(batch)
    metrics["rollout/aborted"] = aborted
    metrics["rollout/stopped"] = int(stopped)
    metrics["rollout/invalid_rewards"] = count_invalid([s for g in (*batch, *ledger.discarded) for s in g])
    metrics["rollout/invalid_reward_causes"] = invalid_reward_causes([s for g in ledger.discarded for s in g])
    metrics["rollout/settled_groups"], metrics["rollout/unusable_groups"] = settled, unusable
    metrics.update(rubric_metrics([s for g in batch for s in g], "rollout/rubric/"))  # each part of a rubric
    metrics.update(agent_metrics([s for g in (*batch, *ledger.discarded) for s in g]))  # openai_agent's forks
    return RolloutFnTrainOutput(samples=batch, metrics=metrics, discarded=ledger.discarded)


async def settle(
    args: RolloutConfig,
    plugins: RunPlugins,
    group: Group,
    ledger: StepLedger,
    kept: list[Group],
    fallback: list[tuple[Group, str]],
    to_buffer: list[Group],
) -> None:
    """Decide a finished task's group: failed, unfinished (back to the buffer), dropped or kept."""
    errors = [s.metadata["generate_error"] for s in group if "generate_error" in s.metadata]
    if errors:
        ledger.fail(group, errors[0])
        return
    if unfinished(group):
        to_buffer.append(group)
        return
    reason = apply_invalid_policy(args, group)  # invalid rewards: fail the run, drop, or score
    if reason is not None:
        ledger.drop(group, reason)
        return
    if plugins.dynamic_filter is None:
        kept.append(group)
        return
    try:
        verdict = await call_dynamic_filter(args, plugins.dynamic_filter, group)  # dynamic_filter
    except PluginCallError as exc:  # a filter's bug fails its group, named; the step goes on
        for sample in group:
            sample.metadata["filter_error"] = str(exc)
        ledger.fail(group, str(exc))
        return
    if verdict.keep:
        kept.append(group)
    elif verdict.keep_when_insufficient:
        fallback.append((group, verdict.reason or "filtered"))
    else:
        ledger.drop(group, verdict.reason or "filtered")


async def order_groups(
    args: RolloutConfig, plugins: RunPlugins, kept: list[Group], ledger: StepLedger
) -> list[Group]:
    """Apply the over-sampling filter; groups it leaves out count as dropped by it."""
    resolved = plugins.over_sampling_filter
    assert resolved is not None
    ordered = await call_over_sampling_filter(args, resolved, kept)
    returned = {id(g) for g in ordered}
    for group in kept:
        if id(group) not in returned:
            ledger.drop(group, f"over_sampling_filter_{resolved.name}")
    return ordered


def reset_for_buffer(
    args: RolloutConfig,
    group: Group,
    rollout_id: int,
    *,
    partial: bool,
    metadata: dict[int, dict[str, Any]] | None = None,
) -> Group:
    """Prepare an unfinished group for the buffer: keep its tokens to resume (partial rollout, earlier
    tokens loss-masked when asked) or start its samples over from the prompt, with the metadata it had
    when it entered the step (``metadata``, by ``id(sample)``): nothing of the abandoned attempt stays."""
    for sample in group:
        if sample.status in FINISHED:
            continue
        if partial and sample.response_length:
            sample.metadata["returned_at_rollout_id"] = rollout_id
            if args.mask_offpolicy_in_partial_rollout and args.partial_rollout:
                sample.loss_mask = [0] * sample.response_length
            sample.status = Sample.Status.ABORTED
            continue
        entered = sample.metadata if metadata is None else metadata.get(id(sample), {})
        sample.metadata = {**entered, "returned_at_rollout_id": rollout_id}
        del sample.tokens[sample.prompt_length :]
        sample.response, sample.response_length = "", 0
        sample.loss_mask = sample.rollout_log_probs = None
        sample.weight_versions = []
        sample.reward = None
        sample.status = Sample.Status.PENDING
    return group


def engine_failed(group: Group) -> bool:
    """Whether the engine failed the group (see :data:`ENGINE_FAULT`) and its prompt may be served again."""
    faulted = any(s.metadata.get(ENGINE_FAULT) for s in group)
    return faulted and all(s.metadata.get(ENGINE_REQUEUES, 0) < MAX_ENGINE_REQUEUES for s in group)


def restart_group(args: RolloutConfig, group: Group, rollout_id: int) -> Group:
    """A copy of a failed group with every sample back at its prompt, for the data source; the failed
    samples stay as they are, with their errors, in the step's discarded groups."""
    fresh = copy.deepcopy(group)
    for sample in fresh:
        for key in ("generate_error", ENGINE_FAULT, "generate_seconds"):
            sample.metadata.pop(key, None)
        sample.metadata[ENGINE_REQUEUES] = sample.metadata.get(ENGINE_REQUEUES, 0) + 1
        sample.status = Sample.Status.PENDING
    return reset_for_buffer(args, fresh, rollout_id, partial=False)


def group_rewards(args: RolloutConfig, groups: list[Group]) -> list[list[float]]:
    """Each group's valid scalar rewards. Without ``reward_key``, a dict reward is the reward post-process's
    to turn into a number (slime's on-policy distillation rewards with the teacher's whole answer)."""
    key = getattr(args, "reward_key", None)
    later = key is None and bool(getattr(args, "custom_reward_post_process_path", None))
    return [
        [
            v
            for v in (
                None if later and isinstance(s.reward, dict) else reward_value(s.reward, key) for s in g
            )
            if v is not None
        ]
        for g in groups
    ]


def scored_reward_metrics(kept: list[list[float]], dropped: list[list[float]]) -> dict[str, Any]:
    """The kept groups' mean reward, and before the filters (kept and dropped groups, by their
    :func:`group_rewards`) the mean and the mean over groups of the population standard deviation."""
    kept_values = [v for row in kept for v in row]
    values = kept_values + [v for row in dropped for v in row]
    spreads = [_pstdev(row) for rows in (kept, dropped) for row in rows if row]
    return {
        "rollout/reward_mean": sum(kept_values) / len(kept_values) if kept_values else None,
        "rollout/reward_mean_before_filter": sum(values) / len(values) if values else None,
        "rollout/reward_group_std_mean": sum(spreads) / len(spreads) if spreads else None,
    }


def _pstdev(values: list[float]) -> float:
    """Population standard deviation in floats (``statistics.pstdev`` works in fractions: 20 times slower)."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def step_metrics(
    args: RolloutConfig, batch: list[Group], ledger: StepLedger, started: float
) -> dict[str, Any]:
    """The step's metrics: the ledger, rewards, lengths, tokens and time."""
    samples = [s for g in batch for s in g]
    elapsed = time.perf_counter() - started
    tokens = sum(s.response_length for s in samples)
    metrics = ledger.metrics()
    metrics.update(
        {
            "rollout/groups": len(batch),
            "rollout/samples": len(samples),
            **scored_reward_metrics(group_rewards(args, batch), group_rewards(args, ledger.discarded)),
            "rollout/response_len_mean": tokens / len(samples) if samples else 0.0,
            "rollout/truncated": sum(s.status is Sample.Status.TRUNCATED for s in samples),
            "rollout/resumed": sum("returned_at_rollout_id" in s.metadata for s in samples),
            "rollout/tokens": tokens,
            "rollout/seconds": elapsed,
            "rollout/tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
            "rollout/failures": ledger.failures,
        }
    )
    return metrics
