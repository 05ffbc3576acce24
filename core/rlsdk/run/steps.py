"""What the outer loop does after a step is trained, in either loop (synchronous or overlapped): outputs
written, the run state saved, the eval, the checkpoint; and the graceful stop that saves what is in flight."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ..config import RolloutConfig
from ..errors import RlsdkError
from ..plugins.calls import call_eval_rollout, call_generate_rollout, call_plugin
from ..plugins.kinds import GenerateRollout, RolloutMetrics
from ..report import RunReport
from ..runtime import Runtime
from ..training.session import TrainingSession
from ..types import RolloutFnEvalOutput, RolloutFnTrainOutput
from .detectors import Detectors
from .determinism import report_nondeterminism
from .learning_signal import no_signal
from .extensions import after_checkpoint, log_eval, log_step, source_state
from .output import RunOutput, sample_row
from .preemption import RunStopped

SHOWN_CAUSES = 3
"""Distinct causes a failed step's error quotes; the rest are in discarded.jsonl."""
TRAINER_POLL_SECONDS = 1.0
"""How often a run waiting on an eval looks whether its trainer is still there."""


@dataclass
class StepRecorder:
    """The run's outputs after each step, and its stop."""

    args: RolloutConfig
    runtime: Runtime
    output: RunOutput
    data_source: Any
    """rlsdk's :class:`~rlsdk.data.DataSource`, or a data_source plugin's."""
    training: TrainingSession | None
    report: RunReport | None
    on_step: Callable[[int, dict[str, Any]], None] | None
    on_eval: Callable[[int, dict[str, Any]], None] | None
    status: Callable[[str], None]
    last_checkpoint: str | None = None
    """The last checkpoint the saved state names (relative to the output folder when inside it)."""
    checkpoint_version: int = 0
    """The trainer's weight version in :attr:`last_checkpoint` (0: the starting weights, which need none)."""
    started: float = field(default_factory=time.monotonic)
    """When the steps began: ``run/elapsed_seconds`` of each step and eval counts from here."""
    detectors: Detectors = field(init=False)
    """The run's silent-failure detectors (:mod:`.detectors`), told of each step."""

    def __post_init__(self) -> None:
        """The run's checks that need its engine up: its detectors (their findings repeated in the run's
        summary), and in deterministic mode each part that stays non-deterministic, named with why."""
        self.detectors = Detectors(self.args, self.output.folder)
        self.output.findings = self.detectors.findings
        self.detectors.check_tokenizers(self.runtime, self.training.trainer if self.training else None)
        if self.args.sglang_enable_deterministic_inference:
            report_nondeterminism(self.args, self.runtime, self.output.folder)

    def generate(self, rollout_id: int) -> RolloutFnTrainOutput:
        """generate_rollout: step ``rollout_id``'s groups from the run's rollout plugin."""
        resolved = self.runtime.plugins.one(GenerateRollout)
        return call_generate_rollout(resolved, self.args, rollout_id, self.data_source, runtime=self.runtime)

    def rollout(self, rollout_id: int) -> RolloutFnTrainOutput:
        """The synchronous loop's rollout verb: an engine restarted since the last sync gets the weights
        again first (T21), then :meth:`generate`; a stopped step stops the run, its groups in the buffer."""
        resynced = self.training.ensure_engine_weights() if self.training is not None else 0
        result = self.generate(rollout_id)
        if resynced:
            result.metrics["train/engine_resyncs"] = resynced
        if result.metrics.get("rollout/stopped"):  # its groups wait in the buffer, tokens kept
            self.stop(rollout_id, [(rollout_id, result)])
        return result

    def record(
        self, rollout_id: int, result: RolloutFnTrainOutput, data_state: dict[str, Any]
    ) -> dict[str, Any]:
        """Write step ``rollout_id`` (its data position after it is ``data_state``) and the run state (saved now
        without training; a training run saves it with each checkpoint); the state is returned."""
        args, output = self.args, self.output
        result.metrics["run/elapsed_seconds"] = time.monotonic() - self.started  # wall-clock curves
        kept = [sample for group in result.samples for sample in group]
        for resolved in self.runtime.plugins.each(RolloutMetrics):  # rollout_metrics: a task's own metrics
            metrics = call_plugin(resolved, args, rollout_id, kept, where=f"at rollout {rollout_id}")
            result.metrics.update({f"custom/{name}": value for name, value in metrics.items()})
        output.write_step(rollout_id, result)
        self.detectors.after_step(
            rollout_id, result
        )  # a constant reward, a drift: warned, repeated at the end
        log_step(args, self.runtime, rollout_id, result)  # rollout_log
        state = output.run_state(rollout_id + 1, data_state, args, self.runtime.pm)
        if self.training is None:
            output.save_state(state)
        check_step(args, rollout_id, result.metrics)
        if self.on_step is not None:
            self.on_step(rollout_id, result.metrics)
        problem = no_signal(args, result.metrics)
        if problem is not None:  # said after the step's table, and again in the run's summary
            warnings.warn(f"step {rollout_id}: {problem}", stacklevel=2)
        return state

    def evaluate_before_training(self) -> None:
        """The eval before the first step (``rollout_id`` -1): written, logged and shown as every eval."""
        self.status("eval before the first step")
        evaluated = self.run_eval(-1)
        self.output.write_eval(-1, evaluated)
        log_eval(self.args, self.runtime, -1, evaluated)  # eval_rollout_log
        if self.on_eval is not None:
            self.on_eval(-1, evaluated.metrics)

    def evaluate(
        self,
        rollout_id: int,
        result: RolloutFnTrainOutput,
        state: dict[str, Any],
        before_eval: Callable[[], Any] | None = None,
    ) -> None:
        """The eval after step ``rollout_id`` when due (every ``eval_interval`` steps and after the last),
        ``before_eval`` first (the overlapped loop brings the engines up to date there)."""
        args, output = self.args, self.output
        last = rollout_id + 1 == args.num_rollout
        if args.eval_interval and ((rollout_id + 1) % args.eval_interval == 0 or last):
            self.status(f"eval after step {rollout_id}")
            if before_eval is not None:
                before_eval()
            evaluated = self.run_eval(rollout_id)
            evaluated.metrics["run/elapsed_seconds"] = time.monotonic() - self.started
            output.write_eval(rollout_id, evaluated)
            log_eval(args, self.runtime, rollout_id, evaluated)  # eval_rollout_log
            state["file_sizes"] = output.file_sizes()  # the eval's rows are the step's (T18)
            if self.training is None:
                output.save_state(state)
            result.metrics.update(evaluated.metrics)
            if self.on_eval is not None:
                self.on_eval(rollout_id, evaluated.metrics)

    def run_eval(self, rollout_id: int) -> RolloutFnEvalOutput:
        """:func:`run_eval`; in a training run whose trainer can be lost on its own (a Ray actor's
        :meth:`~rlsdk.ray.trainer_actor.RemoteTrainer.lost`), in a thread of its own while this one looks at
        the trainer every :data:`TRAINER_POLL_SECONDS`: a trainer gone meanwhile stops the run at once,
        naming it and the last checkpoint, the eval abandoned (its requests end with the run's engines)
        rather than drained for results nothing will train on (each of its samples may take
        ``--generate-timeout``)."""
        lost = getattr(self.training.trainer, "lost", None) if self.training is not None else None
        if lost is None:
            return run_eval(self.args, self.runtime, rollout_id)
        during = " during the eval " + (
            f"after step {rollout_id}" if rollout_id >= 0 else "before the first step"
        )
        outcome: dict[str, Any] = {}

        def evaluate() -> None:
            try:
                outcome["value"] = run_eval(self.args, self.runtime, rollout_id)
            except BaseException as exc:  # handed back to the run's thread
                outcome["error"] = exc

        thread = threading.Thread(target=evaluate, name="rlsdk-eval", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(TRAINER_POLL_SECONDS)
            if thread.is_alive() and (error := lost(during)) is not None:
                raise error
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def checkpoint(self, rollout_id: int, result: RolloutFnTrainOutput, state: dict[str, Any]) -> None:
        """A training run's checkpoint after step ``rollout_id`` when due, and the step in the report."""
        args, output = self.args, self.output
        if self.training is not None and self.training.checkpoint_due(rollout_id):
            # A training run resumes from its last checkpoint: state.json moves only with one.
            self.save_checkpoint(rollout_id, state)
            output.save_state(state)
            after_checkpoint(
                args, self.runtime, rollout_id, output.checkpoint_path(state)
            )  # checkpoint_callback
        if self.report is not None:
            self.report.add(rollout_id, result.metrics)

    def save_checkpoint(self, rollout_id: int, state: dict[str, Any]) -> None:
        assert self.training is not None
        self.output.set_checkpoint(state, self.training.save(rollout_id, state))
        self.last_checkpoint, self.checkpoint_version = state["checkpoint"], self.training.weight_version

    def stop(self, next_rollout_id: int, untrained: list[tuple[int, RolloutFnTrainOutput]]) -> NoReturn:
        """Stop on request: the ``untrained`` steps' kept groups go back to the buffer (served first on
        ``--resume``; their dropped and failed ones to discarded.jsonl), the state is saved with a
        checkpoint of the weights trained since the last one, and :class:`RunStopped` is raised."""
        returned = []
        for rollout_id, result in untrained:
            self.output.append(
                "discarded.jsonl", [sample_row(rollout_id, s) for g in result.discarded for s in g]
            )
            returned += result.samples
        if returned:
            self.data_source.add_samples(returned, next_rollout_id)
        state = self.output.run_state(
            next_rollout_id, source_state(self.data_source), self.args, self.runtime.pm
        )
        saved = False
        if self.training is not None:
            if self.training.weight_version != self.checkpoint_version:
                self.status("saving a checkpoint before stopping")
                self.save_checkpoint(next_rollout_id - 1, state)
                saved = True
            elif self.last_checkpoint is not None:
                state["checkpoint"] = self.last_checkpoint
        self.output.save_state(state)
        if saved:
            after_checkpoint(self.args, self.runtime, next_rollout_id - 1, self.output.checkpoint_path(state))
        raise RunStopped(self.runtime.stop.reason, self.output.folder)


def check_step(args: RolloutConfig, rollout_id: int, metrics: dict[str, Any]) -> None:
    """A step whose every sample failed, or was dropped for an invalid reward, stops the run with the causes
    (``on_failed_step=fail``), after the step's samples and the run's state are written and before any
    training or checkpoint. A step that stopped early because every group it ran was unusable (T1/T2: what
    was still in flight went back to the data) counts the samples it ran."""
    if args.on_failed_step != "fail" or metrics.get("ledger/kept"):
        return
    entered = metrics.get("ledger/entered")
    failed = metrics.get("ledger/failed", 0)
    invalid = metrics.get("rollout/dynamic_filter/drop_invalid_reward", 0)
    unusable = metrics.get("rollout/unusable_groups", 0)
    stopped_early = bool(unusable) and unusable == metrics.get("rollout/settled_groups")
    ran = " it ran" if stopped_early and failed + invalid != entered else ""
    if failed and not invalid and (failed == entered or stopped_early):
        requeued = metrics.get("ledger/requeued", 0)
        kept_data = (
            f"; their prompts are not used up ({requeued} samples back in the data, served again on --resume)"
            if requeued
            else ""
        )
        raise RlsdkError(
            f"step {rollout_id}: all {failed} samples{ran} failed ({shown_causes(metrics, 'rollout/failures')}); "
            f"nothing was trained or checkpointed, the samples are in discarded.jsonl{kept_data} "
            "(--on-failed-step continue goes on)"
        )
    if invalid and (invalid + failed == entered or stopped_early):
        raise RlsdkError(
            f"step {rollout_id}: all {invalid + failed} samples{ran} were dropped for an invalid reward"
            f"{' or failed' if failed else ''} ({shown_causes(metrics, 'rollout/invalid_reward_causes')}); "
            "nothing was trained or checkpointed, the samples are in discarded.jsonl (--on-failed-step "
            "continue goes on, --on-invalid-reward score scores them instead)"
        )


def shown_causes(metrics: dict[str, Any], key: str) -> str:
    """The first :data:`SHOWN_CAUSES` distinct causes of ``metrics[key]``; the rest are in discarded.jsonl."""
    causes = list(dict.fromkeys(metrics.get(key, [])))
    shown = "; ".join(causes[:SHOWN_CAUSES]) or "unknown"
    if len(causes) > SHOWN_CAUSES:
        shown += f"; {len(causes) - SHOWN_CAUSES} more in discarded.jsonl"
    return shown


def run_eval(args: RolloutConfig, runtime: Runtime, rollout_id: int) -> RolloutFnEvalOutput:
    """generate_rollout with ``evaluation=True`` (the eval function, else the rollout function); its time
    in ``eval/seconds``."""
    started = time.perf_counter()
    output = call_eval_rollout(runtime.plugins.eval_rollout, args, rollout_id, runtime=runtime)
    output.metrics["eval/seconds"] = time.perf_counter() - started
    return output
