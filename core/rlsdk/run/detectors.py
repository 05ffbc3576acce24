"""Detectors for runs that go on but are silently wrong (issue 48): each finding is a warning when it is found
and is repeated in the run's summary (``rlsdk run``'s last lines, and ``detected.json`` in the output folder).

- a reward that gives every sample the same value step after step (``constant_reward_steps``): a reward that
  never reads the answer, a label key that names nothing, a grader that always fails;
- a sampler and a trainer that drifted apart: a step's mean gap between the engine's and the trainer's
  log-probs of the sampled tokens (``train/rollout_logprob_diff``) above 4x the run's own noise (the trust
  check's, ``train/sync_logprob_noise``) and above :data:`GAP_FLOOR`, in a run whose samples come from the
  trainer's current policy (no ``--async``, no policy-version lag); ``train/rollout_kl`` and
  ``train/rollout_tokens_over_gap`` are its per-step metrics. The gap is measured on the samples the
  trainer's weights sampled: one continued after a weight sync (a partial rollout, a group back from the
  buffer after an engine died) differs by design and is left out, its share ``train/rollout_gap_excluded``;
- a data column named but absent (``--label-key`` that no row has: an error before the engine starts; one
  some rows lack: a warning naming how many);
- images that never reach the trainer: a trained sample with multimodal inputs in a step whose trainer
  batch held fewer (``train/multimodal_samples``, which a trainer that feeds them to its forward pass
  reports; rlsdk's ``torch`` and ``megatron`` trainers take text only);
- multi-turn requested, single-turn ran: a generator or agent that declares ``multi_turn`` whose every
  sample got one model turn (one ``weight_versions`` entry) over the run's first :data:`SINGLE_TURN_STEPS`
  steps: a tools column that names nothing, a tool-call format the model does not write, a stop string
  never hit;
- a plugin option given (``--set``, a config file) at a value other than its default that no plugin read
  during the run: the plugin that declares it did not run (another one was named) or never needed it.
  Reads are seen in the run's own process: a run on Ray (``--ray``), whose plugins read options in their
  actors too, is not checked;
- an engine and a trainer that disagree on the tokenizer: its size, end and start tokens or chat template
  (:func:`~rlsdk.engine_api.tokenizer_fingerprint`) as the engine, the run (its prompt ids) and the trainer
  report them, before the first step; an engine or trainer that cannot report is named once in the log.
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..config import RolloutConfig
from ..engines.tokenizer_facts import tokenizer_fingerprint
from ..plugins.kinds import Agent, CustomGenerate
from ..plugins.manager import RlsdkPluginManager
from ..runtime import Runtime, plugins_of
from ..training.trainer import PolicyTrainer
from ..training_options import overlapped
from ..types import RolloutFnTrainOutput
from .learning_signal import cause

log = logging.getLogger(__name__)

GAP_FLOOR = 0.01
"""Nats: a sampler-trainer gap below this is never reported (bfloat16 and batching noise stay well below)."""
SINGLE_TURN_STEPS = 3
"""Steps (the run's first; fewer in a shorter run) in which every sample of a multi-turn generator got one
model turn before the run is warned."""
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
    single_turn_steps: int | None = 0
    """Steps so far in which every sample got one model turn (None: one got more, or none was asked)."""

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
        self.check_logprob_gap(rollout_id, result)
        self.check_multimodal_trained(rollout_id, result)
        self.check_turns(rollout_id, result)

    def check_tokenizers(self, runtime: Runtime, trainer: PolicyTrainer | None) -> None:
        """Before the first step: the tokenizer as the engine, the run and the trainer report it."""
        sides: dict[str, dict[str, object]] = {}
        engine = runtime.run(runtime.engine.tokenizer_info())
        if engine is not None:
            sides["the engine"] = engine
        if runtime.tokenizer is not None:
            sides["the run's tokenizer (the prompt ids)"] = tokenizer_fingerprint(runtime.tokenizer)
        learner = trainer.tokenizer_info() if trainer is not None else None
        if learner is not None:
            sides["the trainer"] = learner
        silent = [
            name
            for name, side, reported in (("engine", runtime.engine, engine), ("trainer", trainer, learner))
            if side is not None and reported is None
        ]
        if silent:
            log.warning(
                "the %s cannot report %s tokenizer: not compared (%s)",
                " and the ".join(silent),
                "their" if len(silent) > 1 else "its",
                ", ".join(type(side).__name__ for side in (runtime.engine, trainer) if side is not None),
            )
        if len(sides) < 2:
            return
        (first, reference), *others = sides.items()
        for name, facts in others:
            differ = [key for key in reference if facts.get(key) != reference[key]]
            if differ:
                self.report(
                    "tokenizer_mismatch",
                    f"{first} and {name} disagree on the tokenizer: "
                    + ", ".join(f"{key} {reference[key]} against {facts.get(key)}" for key in differ)
                    + ": token ids (or the chat template's text) mean different things on the two sides, so "
                    "the trainer learns from other tokens than the engine sampled. Load both from one model "
                    "folder (--model, --hf-checkpoint) and give both the same chat template",
                )
                return

    def check_options_read(self, read: set[str], pm: RlsdkPluginManager) -> None:
        """At the end of the run: plugin options given that no plugin read (not on Ray; see above)."""
        unread = [] if self.args.ray_address else unread_options(self.args, read, pm)
        if unread:
            self.report(
                "option_unread",
                f"option{'s' if len(unread) > 1 else ''} given but read by no plugin during the run: "
                f"{', '.join(unread)}. The plugin that takes {'them' if len(unread) > 1 else 'it'} did not "
                "run or never needed it: check that the run names that plugin (its kind's option)",
            )

    def check_multimodal_trained(self, rollout_id: int, result: RolloutFnTrainOutput) -> None:
        """Trained samples with images (or other multimodal inputs) against those the trainer's batch held."""
        if "train/samples" not in result.metrics:  # not trained this step
            return
        media = [s for group in result.samples for s in group if any((s.multimodal_inputs or {}).values())]
        held = int(result.metrics.get("train/multimodal_samples", 0))
        if len(media) > held:
            kinds = sorted(
                {key for s in media for key, value in (s.multimodal_inputs or {}).items() if value}
            )
            self.report(
                "multimodal_dropped",
                f"step {rollout_id}: {len(media)} trained samples carry multimodal inputs ({', '.join(kinds)}; "
                f"the first: sample {media[0].group_index}/{media[0].index}), but the trainer's batch held "
                f"{held}: the engine sampled with them and the trainer learns from the text alone. Use a "
                "trainer that feeds them to the model's forward pass (it reports train/multimodal_samples)",
            )

    def check_turns(self, rollout_id: int, result: RolloutFnTrainOutput) -> None:
        """A multi-turn generator or agent whose every sample got one model turn, step after step."""
        if self.single_turn_steps is None or not result.samples:
            return
        asked = multi_turn_plugin(self.args)
        samples = [s for group in result.samples for s in group]
        turns = [len(s.weight_versions) for s in samples]  # one entry per engine call
        if asked is None or self.args.max_turns < 2 or max(turns) > 1 or min(turns) == 0:
            self.single_turn_steps = None
            return
        self.single_turn_steps += 1
        if self.single_turn_steps >= min(SINGLE_TURN_STEPS, max(self.args.num_rollout, 1)):
            self.report(
                "single_turn",
                f"{asked} runs up to {self.args.max_turns} model turns a sample (max_turns), but every sample "
                f"of the {self.single_turn_steps} steps up to step {rollout_id} got one: the multi-turn "
                "behaviour fell back to single-turn. Likely causes: the samples name no tools (the data's "
                "tools column, --tool-key, or tool_names), the model writes no tool call in the format "
                "read (tool_call_format), or the agent answered at once",
            )

    def check_logprob_gap(self, rollout_id: int, result: RolloutFnTrainOutput) -> None:
        gap, noise = (
            result.metrics.get("train/rollout_logprob_diff"),
            result.metrics.get("train/sync_logprob_noise"),
        )
        if gap is None or noise is None or overlapped(self.args):  # stale samples differ by design
            return
        if gap > max(4 * noise, GAP_FLOOR):
            kl, over = (
                result.metrics.get("train/rollout_kl"),
                result.metrics.get("train/rollout_tokens_over_gap"),
            )
            self.report(
                "logprob_gap",
                f"step {rollout_id}: the engine's log-probs of the sampled tokens differ from the trainer's by "
                f"{gap:.3g} nats a token on average, {gap / max(noise, 1e-12):.0f}x the run's noise ({noise:.2g}; "
                f"sampled-token KL {kl if kl is None else format(kl, '.3g')}, "
                f"{over if over is None else format(over, '.1%')} of tokens past 1 nat; "
                f"{result.metrics.get('train/rollout_gap_excluded', 0.0):.0%} of the samples left out as "
                "sampled by earlier weights): the trainer learns from "
                "tokens it would not have sampled. Check that the engine and the trainer load the same model, "
                "tokenizer and chat template, and what a custom generator or sample hook does to rollout_log_probs",
            )

    def check_constant_reward(self, rollout_id: int, result: RolloutFnTrainOutput) -> None:
        """Every scored sample (kept or filtered out) got one value, the same value step after step: the
        step metrics :mod:`.learning_signal` reads, and its likely cause."""
        limit = self.args.constant_reward_steps
        low, high = result.metrics.get("rollout/reward_min"), result.metrics.get("rollout/reward_max")
        if low is None or low != high:
            self.constant, self.constant_steps = None, 0
            return
        self.constant_steps = self.constant_steps + 1 if low == self.constant else 1
        self.constant = low
        if limit and self.constant_steps >= limit:
            self.report(
                "constant_reward",
                f"the reward {self.args.choices.get('rm_type')!r} gave every sample {low:g} in each of the "
                f"{self.constant_steps} steps up to step {rollout_id}: no group has an advantage, so nothing is "
                f"learned. Likely cause: {cause(self.args, result.metrics)} (--constant-reward-steps 0 turns this "
                "check off)",
            )


def unread_options(args: RolloutConfig, read: set[str], pm: RlsdkPluginManager) -> list[str]:
    """The plugin options ``args`` sets to other than their defaults that are not in ``read``, each with
    its value and the distribution declaring it."""
    declared = pm.options(reserved=RolloutConfig.option_names())
    return [
        f"{name}={value!r} ({declared[name][1].describe()})"
        for name, value in args.extra.items()
        if name in declared and name not in read and value != declared[name][0].default
    ]


def multi_turn_plugin(args: RolloutConfig) -> str | None:
    """The run's generator or agent that declares itself multi-turn, described (None: neither does)."""
    plugins = plugins_of(args)
    generator = plugins.one(CustomGenerate)
    if generator.record.multi_turn:
        return generator.describe()
    agent = plugins.get(Agent)
    return agent.describe() if agent is not None and agent.record.multi_turn else None
