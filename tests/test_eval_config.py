"""``--eval-config``: slime's multi-task eval file, resolved as slime resolves it (the entry, then
``eval.defaults``, then the run's options), written from the cases of slime's tests/test_eval_config.py and its
examples/eval_multi_task/multi_task.yaml. The eval's requests are checked on ``rlsdk.testing.FakeEngine`` (it
records each payload); the last test runs the real ``rlsdk eval`` on the tiny Llama."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlsdk import RolloutConfig
from rlsdk.data.eval_sets import read_eval_config, resolve_datasets, run_eval_datasets
from rlsdk.rollout.evaluation import eval_rollout
from rlsdk.runtime import Runtime, bind_runtime
from rlsdk.testing import FakeEngine

MULTI_TASK = """\
eval:
  defaults:
    max_response_len: 16384
    top_p: 0.7
  datasets:
    - name: aime
      path: {aime}
      rm_type: deepscaler
      n_samples_per_eval_prompt: 16
    - name: gpqa    # hf download --repo-type dataset zyzshishui0627/gpqa_diamond --local-dir /root/gpqa
      path: {gpqa}
      rm_type: gpqa
      n_samples_per_eval_prompt: 2
    - name: ifbench   # hf download --repo-type dataset zyzshishui0627/IFBench --local-dir /root/ifbench
      path: {ifbench}
      rm_type: ifbench
      n_samples_per_eval_prompt: 1
"""
"""slime's examples/eval_multi_task/multi_task.yaml (624b824), its paths made this test's."""


def slime_args(**overrides):
    """slime's own ``args`` as its eval config sees them (the arguments its tests set)."""
    values = dict(rollout_temperature=0.8, rollout_top_p=1.0, rollout_stop=["</train_stop>"],
                  rollout_stop_token_ids=[7], eval_min_new_tokens=None)
    return SimpleNamespace(**{**values, **overrides})


# ----- slime's cases: entry > eval.defaults > the run's options --------------------------------------------


def test_defaults_slime_has_no_run_option_for_reach_every_dataset():
    with pytest.warns(UserWarning, match=r"\['eval_task_timeout'\] are ignored: slime parses"):
        datasets = resolve_datasets(
            slime_args(), [{"name": "aime", "path": "/d/aime.jsonl"}, {"name": "gpqa", "path": "/d/gpqa.jsonl"}],
            {"rm_type": "deepscaler", "repetition_penalty": 1.05, "eval_task_timeout": 120})
    assert [(d.rm_type, d.repetition_penalty) for d in datasets] == [("deepscaler", 1.05)] * 2


def test_a_dataset_entry_wins_over_the_defaults():
    aime, gpqa = resolve_datasets(
        slime_args(),
        [{"name": "aime", "path": "/d/aime.jsonl", "rm_type": "math", "temperature": 0.2},
         {"name": "gpqa", "path": "/d/gpqa.jsonl"}],
        {"rm_type": "deepscaler", "temperature": 0.7})
    assert (aime.rm_type, aime.temperature) == ("math", 0.2)
    assert (gpqa.rm_type, gpqa.temperature) == ("deepscaler", 0.7)


def test_stop_settings_come_from_the_entry_then_the_defaults_then_the_run():
    a, b, c = resolve_datasets(
        slime_args(eval_min_new_tokens=4),
        [{"name": "a", "path": "/d/a.jsonl", "stop": ["</answer>"], "min_new_tokens": 8},
         {"name": "b", "path": "/d/b.jsonl"}, {"name": "c", "path": "/d/c.jsonl"}],
        {"stop_token_ids": [11, 12]})
    assert (a.stop, a.min_new_tokens) == (["</answer>"], 8)
    assert b.stop_token_ids == [11, 12] and b.stop == ["</train_stop>"]
    assert (c.stop_token_ids, c.min_new_tokens) == ([11, 12], 4)


def test_an_unknown_default_is_an_error_naming_it_and_the_valid_keys():
    with pytest.raises(ValueError, match=r"Unknown key\(s\) in eval.defaults: \['temperture'\]\. Valid keys: .*'temperature'"):
        resolve_datasets(slime_args(), [{"name": "aime", "path": "/d/aime.jsonl"}], {"temperture": 0.7})


def test_settings_no_one_gives_fall_back_to_the_run():
    [aime] = resolve_datasets(slime_args(rollout_temperature=0.9), [{"name": "aime", "path": "/d/aime.jsonl"}], {})
    assert aime.temperature == 0.9 and aime.top_p == 1.0


def test_rlsdk_options_are_the_run_options_of_the_fallback():
    args = RolloutConfig(input_key="question", label_key="answer", eval_temperature=0.3, rollout_top_k=40,
                         n_samples_per_eval_prompt=3, extra={"eval_top_k": 5, "eval_input_key": "q"})
    [held] = resolve_datasets(args, [{"name": "held", "path": "h.jsonl"}], {})
    assert (held.input_key, held.label_key, held.temperature, held.top_k, held.n_samples_per_eval_prompt) == (
        "q", "answer", 0.3, 5, 3)


def test_eval_datasets_entries_set_their_own_pass_key_and_threshold():
    """rlsdk's pass settings (``eval_pass_key``, ``eval_pass_threshold``) per ``eval_datasets`` entry, else the run's."""
    args = RolloutConfig(eval_pass_threshold=0.5, eval_datasets=[
        {"name": "a", "path": "a.jsonl", "eval_pass_key": "format", "eval_pass_threshold": 1},
        {"name": "b", "path": "b.jsonl"}])
    a, b = run_eval_datasets(args)
    assert (a.eval_pass_key, a.eval_pass_threshold, b.eval_pass_key, b.eval_pass_threshold) == ("format", 1, None, 0.5)
    with pytest.raises(ValueError, match="unknown key"):  # --eval-config's keys are slime's only
        resolve_datasets(args, [{"name": "c", "path": "c.jsonl", "eval_pass_key": "format"}], {})


# ----- the file's layout and its errors ---------------------------------------------------------------------


def write(tmp_path, text, name="eval.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_eval_wrapper_is_optional_and_datasets_may_map_names_to_entries(tmp_path):
    wrapped = write(tmp_path, "eval:\n  datasets:\n    - {name: a, path: a.jsonl}\n", "wrapped.yaml")
    bare = write(tmp_path, "defaults: {top_k: 3}\ndatasets:\n  a: {path: a.jsonl}\n  b:\n    path: b.jsonl\n", "bare.yaml")
    as_json = write(tmp_path, json.dumps({"eval": {"datasets": {"a": {"path": "a.jsonl"}}}}), "eval.json")
    assert read_eval_config(wrapped) == ({}, [{"name": "a", "path": "a.jsonl"}])
    assert read_eval_config(bare) == ({"top_k": 3}, [{"name": "a", "path": "a.jsonl"}, {"name": "b", "path": "b.jsonl"}])
    assert read_eval_config(as_json) == ({}, [{"name": "a", "path": "a.jsonl"}])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", "must contain a mapping at the root"),
        ("eval: [1]\n", "must define an `eval` mapping"),
        ("eval: {defaults: {top_p: 0.5}}\n", "does not define any datasets under `eval.datasets`"),
        ("eval: {datasets: 3}\n", "eval.datasets must be either a list or a mapping"),
        ("eval: {datasets: [{path: a.jsonl}]}\n", "must include a `name` field"),
        ("eval: {datasets: [{name: a, path: a.jsonl, rm_typ: math}]}\n",
         r"eval dataset 'a': unknown key\(s\) \['rm_typ'\] \(did you mean 'rm_type'\?\)\. Valid keys: \['app_service'"),
        ("eval: {datasets: [{name: a, path: a.jsonl, reward_key: score}]}\n", r"unknown key\(s\) \['reward_key'\]"),
        ("eval: {datasets: [{name: a}]}\n", "eval dataset 'a' needs a path"),
        ("eval: {datasets: [{name: a, path: a.jsonl, metadata_overrides: [1]}]}\n", "metadata_overrides must be dict"),
        ("eval: {datasets: [{name: a, path: a.jsonl, min_eval_samples: 0}]}\n", "min_eval_samples must be positive"),
        ("eval: {datasets: [{name: a, path: a.jsonl, n_samples_per_eval_prompt: many}]}\n",
         "n_samples_per_eval_prompt must be int, got 'many'"),
        ("eval: {datasets: [{name: a, path: a.jsonl}, {name: a, path: b.jsonl}]}\n", r"\['a'\] are given twice"),
        ("eval: {datasets: [{name: a, path: '${oc.env:HOME}/a.jsonl'}]}\n", "OmegaConf interpolation"),
    ],
)
def test_a_malformed_eval_config_is_an_error_naming_the_file(tmp_path, text, message):
    if "OmegaConf" in message and importlib.util.find_spec("omegaconf") is not None:
        pytest.skip("OmegaConf is installed: it resolves the interpolation")
    path = write(tmp_path, text)
    with pytest.raises(ValueError, match=message) as caught:
        run_eval_datasets(RolloutConfig(eval_config=str(path)))
    assert str(path) in str(caught.value)


def test_an_eval_config_replaces_eval_prompt_data_as_in_slime(tmp_path):
    path = write(tmp_path, "eval: {datasets: [{name: a, path: a.jsonl}]}\n")
    args = RolloutConfig(eval_config=str(path), eval_prompt_data=["old", "old.jsonl"],
                         eval_datasets=[{"name": "mine", "path": "m.jsonl", "reward_key": "score"}])
    with pytest.warns(UserWarning, match="replaces --eval-prompt-data"):
        assert [(d.name, d.reward_key) for d in run_eval_datasets(args)] == [("mine", "score"), ("a", None)]


# ----- slime's multi-task example -----------------------------------------------------------------------------


def multi_task_files(folder: Path) -> Path:
    """slime's multi-task config over small sets in its three formats: AIME-style math (``prompt``/``label``),
    GPQA with ``metadata.correct_letter``, IFBench with ``metadata.instruction_id_list``."""
    sets = {
        "aime": [{"prompt": f"What is {a} * 7?", "label": str(a * 7)} for a in (3, 6)],
        "gpqa": [{"prompt": "Pick A.", "label": "A", "metadata": {"correct_letter": "A"}},
                 {"prompt": "Pick B.", "label": "B", "metadata": {"correct_letter": "B"}}],
        "ifbench": [{"prompt": "Answer in one word.", "metadata": {"instruction_id_list": ["count:word_count_range"]}}],
    }
    for name, rows in sets.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return write(folder, MULTI_TASK.format(**{name: folder / f"{name}.jsonl" for name in sets}), "multi_task.yaml")


def test_slimes_multi_task_config_resolves_as_slime_resolves_it(tmp_path):
    config = multi_task_files(tmp_path)
    args = RolloutConfig(eval_config=str(config), input_key="prompt", label_key="label", rollout_temperature=1.0)
    aime, gpqa, ifbench = run_eval_datasets(args)
    assert [(d.name, d.rm_type, d.n_samples_per_eval_prompt) for d in (aime, gpqa, ifbench)] == [
        ("aime", "deepscaler", 16), ("gpqa", "gpqa", 2), ("ifbench", "ifbench", 1)]
    assert {(d.max_response_len, d.top_p, d.temperature, d.input_key) for d in (aime, gpqa, ifbench)} == {
        (16384, 0.7, 1.0, "prompt")}


@pytest.mark.plugins("rlsdk_rm_hub")
def test_slimes_multi_task_eval_scores_each_dataset_with_its_own_reward_count_and_sampling(rlsdk_pm, tmp_path):
    """aime and gpqa as slime's file gives them (rlsdk has no IFBench grader: that entry is left out here). Each
    dataset's requests carry the defaults' sampling; pass@k is reported per dataset up to its own sample count
    (slime's uses the run's count, so its own example logs none)."""
    rlsdk_pm.register(importlib.import_module("rlsdk_rm_hub.plugin"))
    config = multi_task_files(tmp_path)
    text = config.read_text()
    config.write_text(text[: text.index("    - name: ifbench")])

    seen: dict[str, int] = {}

    def reply(payload, call):  # the first aime prompt right every other time; gpqa's "A" always
        prompt = bytes(payload["input_ids"]).decode()
        seen[prompt] = seen.get(prompt, 0) + 1
        if "Pick" in prompt:
            return "Answer: A"
        return "</think> \\boxed{21}" if "3 * 7" in prompt and seen[prompt] % 2 else "</think> \\boxed{0}"

    engine = FakeEngine(reply)
    args = RolloutConfig(eval_config=str(config), input_key="prompt", label_key="label")
    runtime = bind_runtime(args, Runtime(rlsdk_pm, engine, engine.tokenizer))
    try:
        out = runtime.run(eval_rollout(args, runtime))
    finally:
        runtime.loop.close()
    assert [len(out.data[name]["samples"]) for name in ("aime", "gpqa")] == [32, 4]
    assert {p["sampling_params"]["max_new_tokens"] for p in engine.payloads} == {16384}
    assert {p["sampling_params"]["top_p"] for p in engine.payloads} == {0.7}
    m = out.metrics
    assert [k for k in m if k.startswith("eval/aime/pass@")] == [f"eval/aime/pass@{k}" for k in (1, 2, 4, 8, 16)]
    assert [k for k in m if k.startswith("eval/gpqa/pass@")] == ["eval/gpqa/pass@1", "eval/gpqa/pass@2"]
    assert m["eval/aime/pass@1"] == pytest.approx(0.25) and m["eval/aime/pass@16"] == 0.5
    assert m["eval/gpqa/reward_mean"] == 0.5 and m["eval/gpqa/pass@2"] == 0.5


@pytest.mark.plugins("rlsdk_embedded", "rlsdk_rm_hub")
def test_rlsdk_eval_takes_eval_config(tmp_path, tiny_llama):
    """The real console script: ``rlsdk eval --eval-config`` on the tiny Llama, each set with its own count;
    the ifbench entry's reward is named in the error, before any generation."""
    config = multi_task_files(tmp_path)
    base = [str(Path(sys.executable).with_name("rlsdk")), "eval", "--model", str(tiny_llama), "--input-key", "prompt",
            "--label-key", "label", "--data", str(tmp_path / "aime.jsonl"), "--eval-config", str(config)]
    failed = subprocess.run(base, capture_output=True, text=True, timeout=300)
    assert failed.returncode != 0 and "ifbench" in failed.stderr
    text = config.read_text()
    config.write_text(text[: text.index("    - name: ifbench")].replace("max_response_len: 16384", "max_response_len: 4"))
    done = subprocess.run([*base, "--output", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads(done.stdout.strip().splitlines()[-1])
    assert metrics["eval/aime/prompts"] == 2 and "eval/aime/pass@16" in metrics and "eval/gpqa/pass@2" in metrics
    samples = [json.loads(line) for line in (tmp_path / "out" / "eval_samples.jsonl").read_text().splitlines()]
    assert sorted({s["dataset"]: 0 for s in samples}) == ["aime", "gpqa"] and len(samples) == 36
