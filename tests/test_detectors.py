"""Detectors for silent failures (issue 48): each test plants its failure in a real run of the tiny Llama (or
its data) and sees it caught: a warning when found, repeated in the run's summary (``detected.json``)."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import pytest

from rlsdk import CustomGenerate, Option, Reward, RolloutConfig, get_plugin_manager, hookimpl, model_turn
from rlsdk.errors import DataError
from rlsdk.run.detectors import SINGLE_TURN_STEPS, SilentFailureWarning
from rlsdk.run.job import check_data, run_job

ZERO_REWARD = """
def zero(args, sample, **kwargs):
    return 0.0
"""


def rollout_run(tiny_llama: Path, data: Path, reward: str, out: Path, **options) -> RolloutConfig:
    values = {
        "model": str(tiny_llama), "prompt_data": str(data), "rm_type": reward, "rollout_batch_size": 2,
        "n_samples_per_prompt": 4, "rollout_max_response_len": 2, "num_rollout": 4, "engine_threads": 1,
        "output_dir": str(out), "sglang_enable_deterministic_inference": True,
    }
    return RolloutConfig(**{**values, **options})


def hooked_run(tiny_llama: Path, run_files: tuple[Path, str], tmp_path: Path, source: str, hook: str,
               **options) -> RolloutConfig:
    """Training steps (two unless ``options`` say otherwise) whose samples pass the sample hook ``hook``
    that ``source`` defines."""
    data, reward = run_files
    path = tmp_path / "hook.py"
    path.write_text(source)
    options = {"train": True, "lr": 1e-3, "num_rollout": 2, "train_threads": 1, **options}
    return rollout_run(tiny_llama, data, reward, tmp_path / "out", rollout_sample_hook_path=[f"{path}:{hook}"],
                       **options)


def metrics_rows(args: RolloutConfig) -> list[dict]:
    """The run's ``metrics.jsonl``, a row a step."""
    return [json.loads(line) for line in (Path(args.output_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.plugins("rlsdk_embedded")
def test_a_reward_constant_over_many_steps_is_caught_and_repeated_in_the_summary(tiny_llama, run_files, tmp_path):
    data, _ = run_files
    reward = tmp_path / "zero.py"
    reward.write_text(ZERO_REWARD)
    out = tmp_path / "out"
    with pytest.warns(SilentFailureWarning, match=r"gave every sample 0 in each of the 3 steps up to step 2"):
        output = run_job(rollout_run(tiny_llama, data, f"{reward}:zero", out, constant_reward_steps=3))
    assert [f["detector"] for f in output.findings] == ["constant_reward"]  # once, though step 3 was constant too
    assert json.loads((out / "detected.json").read_text())["detected"] == output.findings


def test_a_label_key_no_row_has_stops_the_run_before_the_engine_starts(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"input": f"q{i}", "answer": str(i)}) + "\n" for i in range(4)))
    with pytest.raises(DataError, match=r"no row has the label key 'label' \(--label-key\); its keys: \['answer', 'input'\]"):
        check_data(RolloutConfig(prompt_data=str(data), label_key="label"))
    data.write_text(
        "".join(json.dumps({"input": f"q{i}", **({"label": str(i)} if i % 2 else {})}) + "\n" for i in range(4))
    )
    with pytest.warns(UserWarning, match=r"2 of 4 rows have no label key 'label' \(the first at .*rows.jsonl:line 1\)"):
        check_data(RolloutConfig(prompt_data=str(data), label_key="label"))


SKEWING_HOOK = """
def skew(args, sample, **kwargs):
    sample.rollout_log_probs = [lp - 0.5 for lp in sample.rollout_log_probs]
    return sample
"""


@pytest.mark.plugins("rlsdk_embedded")
def test_a_sampler_and_trainer_that_drifted_apart_are_caught(tiny_llama, run_files, tmp_path):
    """A sample hook plants the drift: every rollout log-prob half a nat below the engine's."""
    args = hooked_run(tiny_llama, run_files, tmp_path, SKEWING_HOOK, "skew", sync_check_tol=1e-3)
    with pytest.warns(SilentFailureWarning, match=r"step 0: the engine's log-probs of the sampled tokens differ .* by 0\.5 nats"):
        output = run_job(args)
    assert [f["detector"] for f in output.findings] == ["logprob_gap"]
    rows = metrics_rows(args)
    assert rows[0]["train/rollout_kl"] == pytest.approx(-0.5, abs=1e-3)
    assert rows[0]["train/rollout_tokens_over_gap"] == 0.0


CONTINUING_HOOK = """
def continued(args, sample, **kwargs):
    if sample.weight_versions == ["1"] and sample.index % 4 < 2:
        sample.weight_versions = ["0", "1"] if sample.index % 4 else ["0"]
        sample.rollout_log_probs = [lp - 0.5 for lp in sample.rollout_log_probs]
    return sample
"""


@pytest.mark.plugins("rlsdk_embedded")
def test_samples_continued_from_earlier_weights_are_left_out_of_the_gap(tiny_llama, run_files, tmp_path):
    """A sample hook plants, in step 1, what an engine death leaves (``test_ray.py``'s engines killed mid-step):
    in each group a sample continued after the weight sync (versions 0 and 1) and one kept from step 0
    (version 0), their log-probs half a nat from the trainer's as older weights' would be. No warning: the
    gap is judged on the samples version 1 sampled, and the metric says how many were left out."""
    args = hooked_run(tiny_llama, run_files, tmp_path, CONTINUING_HOOK, "continued", sync_check_tol=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SilentFailureWarning)
        output = run_job(args)
    assert output.findings == []
    rows = metrics_rows(args)
    assert rows[0]["train/rollout_gap_excluded"] == 0.0
    assert rows[1]["train/rollout_gap_excluded"] == pytest.approx(0.5)  # 2 of each group's 4
    assert rows[1]["train/rollout_logprob_diff"] < 1e-4 and abs(rows[1]["train/rollout_kl"]) < 1e-4


@pytest.mark.plugins("rlsdk_embedded")
def test_a_healthy_run_is_not_flagged(tiny_llama, run_files, tmp_path):
    """A reward that varies, a sampler and a trainer in step: no detector speaks, even at two steps."""
    data, reward = run_files
    args = rollout_run(tiny_llama, data, reward, tmp_path / "out", train=True, lr=1e-3, num_rollout=3,
                       train_threads=1, sync_check_tol=1e-3, constant_reward_steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SilentFailureWarning)
        output = run_job(args)
    assert output.findings == [] and not (tmp_path / "out" / "detected.json").exists()
    rows = metrics_rows(args)
    assert all(abs(row["train/rollout_kl"]) < 1e-4 and row["train/rollout_tokens_over_gap"] == 0.0 for row in rows)


IMAGE_HOOK = """
def with_image(args, sample, **kwargs):
    sample.multimodal_inputs = {"images": ["data:image/png;base64,iVBORw0KGgo="]}
    return sample
"""


@pytest.mark.plugins("rlsdk_embedded")
def test_images_the_trainer_never_sees_are_caught(tiny_llama, run_files, tmp_path):
    """A sample hook puts an image on every sample after generation (the embedded engine refuses images; a
    vision-language model under SGLang would take them): the torch trainer's batch holds text only."""
    args = hooked_run(tiny_llama, run_files, tmp_path, IMAGE_HOOK, "with_image", num_rollout=1)
    with pytest.warns(SilentFailureWarning, match=r"step 0: 8 trained samples carry multimodal inputs \(images; .*"
                      r"but the trainer's batch held 0: .* learns from the text alone"):
        output = run_job(args)
    assert [f["detector"] for f in output.findings] == ["multimodal_dropped"]


class Turns:
    """A multi-turn generator (it says so) that makes ``turns`` model turns a sample."""

    def __init__(self, turns: int) -> None:
        self.turns = turns

    @hookimpl
    def rlsdk_custom_generates(self):
        yield CustomGenerate(name="turns", func=self.generate, multi_turn=True)

    async def generate(self, args, sample, sampling_params):
        for _ in range(self.turns):
            await model_turn(args, sample, {**sampling_params, "max_new_tokens": sample.response_length + 1})
        return sample


@pytest.mark.plugins("rlsdk_embedded")
@pytest.mark.parametrize("turns", [1, 2])
def test_a_multi_turn_generator_that_ran_single_turn_is_caught(tiny_llama, run_files, tmp_path, turns):
    """A generator that declares itself multi-turn: one model turn a sample in each of the run's first steps
    is caught; two are not."""
    data, reward = run_files
    out = tmp_path / "out"
    args = rollout_run(tiny_llama, data, reward, out, num_rollout=SINGLE_TURN_STEPS,
                       custom_generate_function_path="turns")
    pm = get_plugin_manager(plugins=[Turns(turns)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SilentFailureWarning)
        output = run_job(args, pm)
    said = [str(w.message) for w in caught if w.category is SilentFailureWarning]
    if turns == 1:
        assert [f["detector"] for f in output.findings] == ["single_turn"]
        assert len(said) == 1 and re.search(
            r"custom_generate 'turns' .* runs up to 4 model turns a sample \(max_turns\), but every sample of "
            r"the 3 steps up to step 2 got one: .* fell back to single-turn", said[0]
        )
    else:
        assert said == [] and output.findings == []


class Scaled:
    """A reward that reads its option ``scale``; the plugin declares another, ``offset``, that nothing reads."""

    @hookimpl
    def rlsdk_options(self):
        yield Option("scale", float, 1.0, help="The reward's factor")
        yield Option("offset", float, 0.0, help="Read by nothing")

    @hookimpl
    def rlsdk_rewards(self):
        yield Reward(name="scaled", func=lambda args, sample: args.scale * (sample.index % 2))


@pytest.mark.plugins("rlsdk_embedded")
def test_a_plugin_option_given_but_never_read_is_caught(tiny_llama, run_files, tmp_path):
    """Both options given: ``scale``, read by the reward of each sample, is not named; ``offset`` is."""
    data, _ = run_files
    pm = get_plugin_manager(plugins=[Scaled()])
    values = rollout_run(tiny_llama, data, "scaled", tmp_path / "out", num_rollout=1).to_dict()
    args = RolloutConfig.from_dict({**values, "scale": 2.0, "offset": 0.5}, pm=pm)
    with pytest.warns(SilentFailureWarning, match=r"option given but read by no plugin during the run: "
                      r"offset=0\.5 \(.*\)\. The plugin that takes it did not run"):
        output = run_job(args, pm)
    assert [f["detector"] for f in output.findings] == ["option_unread"]
    assert "scale" not in output.findings[0]["message"]


@pytest.mark.plugins("rlsdk_embedded")
def test_an_engine_and_a_trainer_that_disagree_on_the_chat_template_are_caught(tiny_llama, run_files, tmp_path):
    """The trainer loads a copy of the model folder whose tokenizer has a chat template the engine's lacks
    (the same weights: the trust check passes); the check before the first step names the difference. Two
    sides that agree (the engine's own tokenizer and the run's) say nothing."""
    data, reward = run_files
    other = tmp_path / "other"
    shutil.copytree(tiny_llama, other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "{{ messages[0].content }}"}))
    args = rollout_run(tiny_llama, data, reward, tmp_path / "out", train=True, lr=1e-3, num_rollout=1,
                       train_threads=1, hf_checkpoint=str(other))
    with pytest.warns(SilentFailureWarning, match=r"the engine and the trainer disagree on the tokenizer: "
                      r"chat_template None against [0-9a-f]{12}: token ids"):
        output = run_job(args)
    assert [f["detector"] for f in output.findings] == ["tokenizer_mismatch"]
