"""`rlsdk run` and `rlsdk eval` end to end on the embedded engine: with the real small model where its
answers matter (the default run, a slime example whose tool text must decode), else with the tiny random
Llama of ``tests/conftest.py`` on word prompts (the files and the flow are under test, not the answers).

Sizes are tiny (a few prompts, short responses) so the module stays within a couple of minutes on
two CPU cores; the model's safetensors copy is cached after its first conversion.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlsdk import RolloutConfig, Sample
from rlsdk.run.arithmetic import TRAIN_DATA
from rlsdk.run.job import run_job

pytestmark = pytest.mark.slow
DEFAULT_DATASET = Path(TRAIN_DATA)

SLIME_FUNCS = Path(__file__).parent / "slime_style" / "slime_funcs.py"
SIZES = ["--num-rollout", "2", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
         "--rollout-max-response-len", "12", "--rollout-shuffle"]
TINY = [*SIZES, "--data", f"{DEFAULT_DATASET}@[0:12]", "--apply-chat-template", "--label-key", "label"]


def rlsdk(*argv: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    """The real console script in a fresh process."""
    exe = Path(sys.executable).with_name("rlsdk")
    return subprocess.run([str(exe), *argv], capture_output=True, text=True, timeout=timeout)


def word_prompts(folder: Path) -> Path:
    """12 prompts in the tiny Llama's words, with labels."""
    path = folder / "words.jsonl"
    rows = ({"input": f"w{i} w{i + 1} w{i + 2}", "label": f"w{i + 3}"} for i in range(12))
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def check_ledger(metrics: list[dict]) -> None:
    for m in metrics:
        assert m["ledger/entered"] == (m["ledger/kept"] + m["ledger/dropped"] + m["ledger/returned"]
                                       + m["ledger/failed"])


def check_sample(row: dict) -> None:
    n = row["response_length"]
    assert n > 0 and len(row["rollout_log_probs"]) == n
    assert row["loss_mask"] is None or len(row["loss_mask"]) == n
    assert all(lp <= 0.0 for lp in row["rollout_log_probs"])
    assert row["status"] in ("completed", "truncated")


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
def test_rlsdk_run_writes_rollouts_metrics_and_state(tmp_path):
    out = tmp_path / "run"
    result = rlsdk("run", *TINY, "--output", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "starting the embedded engine (loading the model)" in result.stderr  # set-up says what it does
    assert "step 0" in result.stderr and "step 1" in result.stderr and "kept" in result.stderr
    assert result.stderr.rstrip().endswith(f"rlsdk view {out}")  # the last line: how to see the run
    rows = read_jsonl(out / "rollouts.jsonl")
    assert [r["rollout_id"] for r in rows] == [0] * 4 + [1] * 4
    for row in rows:
        check_sample(row)
        assert row["reward"] in (0.0, 1.0) and row["label"]
        assert Sample.from_dict(row).tokens == row["tokens"]  # rlsdk's own output reads back as samples
    metrics = read_jsonl(out / "metrics.jsonl")
    assert len(metrics) == 2
    check_ledger(metrics)
    for m in metrics:  # the kept samples' mean beside the mean before the filter and the groups' spread
        assert {"rollout/reward_mean_before_filter", "rollout/reward_group_std_mean"} <= set(m)
    assert json.loads((out / "state.json").read_text())["next_rollout_id"] == 2

    again = rlsdk("run", *TINY, "--output", str(out), timeout=60)  # refused before any model loads
    assert again.returncode == 1 and "holds a run" in again.stderr and "--overwrite" in again.stderr
    assert len(read_jsonl(out / "rollouts.jsonl")) == 8


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
def test_rlsdk_eval_writes_metrics_and_samples_to_output(tmp_path, tiny_llama):
    out = tmp_path / "eval"
    data = word_prompts(tmp_path)
    result = rlsdk("eval", "--model", str(tiny_llama), "--data", f"{data}@[0:2]", "--label-key", "label",
                   "--n-samples-per-eval-prompt", "2", "--rollout-max-response-len", "6", "--output", str(out),
                   "--eval-rollout-log", "jsonl")
    assert result.returncode == 0, result.stderr[-3000:]
    [metrics] = read_jsonl(out / "eval.jsonl")
    [logged] = read_jsonl(out / "logs" / "eval_rollout_log.jsonl")  # --eval-rollout-log is called, as in a run
    assert logged["metrics"]["eval/words/prompts"] == 2 and len(logged["rewards"]["words"]) == 4
    samples = read_jsonl(out / "eval_samples.jsonl")
    assert metrics["eval/words/prompts"] == 2 and len(samples) == 4
    assert {s["dataset"] for s in samples} == {"words"}
    assert all(s["response_length"] for s in samples)


HANGING_REWARD = """
import json
import os
import time


def saved_a_step(state):
    return os.path.exists(state) and json.loads(open(state).read())["next_rollout_id"] >= 1


def reward(args, sample, **kwargs):
    state = os.environ.get("HANG_ONCE_SAVED")
    while state and saved_a_step(state):  # the run under test is then killed
        time.sleep(0.05)
    return float(sample.response_length % 2)
"""


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
def test_resume_after_a_killed_run_serves_exactly_the_remaining_groups(tmp_path, tiny_llama):
    """An uninterrupted run and a run killed after its first step, then resumed, write the same
    prompts in the same order, each step once. The killed run is a real ``rlsdk run`` process, SIGKILLed
    while its reward hangs in a later step (once the first step's state is saved); the uninterrupted and
    the resumed run are ``run_job`` in process, on the same config file."""
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    reward = tmp_path / "hanging_reward.py"
    reward.write_text(HANGING_REWARD)
    config = tmp_path / "run.json"
    config.write_text(json.dumps({
        "model": str(tiny_llama), "prompt_data": str(word_prompts(tmp_path)), "label_key": "label",
        "num_rollout": 3, "rollout_batch_size": 2, "n_samples_per_prompt": 2, "rollout_max_response_len": 4,
        "rollout_shuffle": True, "custom_rm_path": f"{reward}:reward",
    }))
    run_job(RolloutConfig.from_file(config, output_dir=str(whole)))

    state = broken / "state.json"
    exe = Path(sys.executable).with_name("rlsdk")
    process = subprocess.Popen([str(exe), "run", "--config", str(config), "--output", str(broken)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                               env={**os.environ, "HANG_ONCE_SAVED": str(state)})
    deadline = time.monotonic() + 300
    while not (state.exists() and json.loads(state.read_text())["next_rollout_id"] >= 1):
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before its first step"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert json.loads(state.read_text())["next_rollout_id"] < 3  # killed with steps left to resume

    run_job(RolloutConfig.from_file(config, output_dir=str(broken), resume=True))
    # a step writes its groups as they finish: the order they were served in is their group_index
    expect = sorted((r["rollout_id"], r["group_index"], r["prompt"]) for r in read_jsonl(whole / "rollouts.jsonl"))
    got = sorted((r["rollout_id"], r["group_index"], r["prompt"]) for r in read_jsonl(broken / "rollouts.jsonl"))
    assert got == expect
    assert [m["rollout_id"] for m in read_jsonl(broken / "metrics.jsonl")] == [0, 1, 2]


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
def test_slime_style_functions_run_unchanged_by_path(tmp_path, tiny_llama):
    """slime functions loaded by file path: a generator that POSTs to /generate itself (the embedded
    engine is served on loopback during the run), a dict reward with --reward-key, a bool dynamic
    filter and a buffer filter."""
    out = tmp_path / "run"
    result = rlsdk(
        "run", *SIZES, "--model", str(tiny_llama), "--data", str(word_prompts(tmp_path)), "--label-key", "label",
        "--output", str(out),
        "--custom-generate-function-path", f"{SLIME_FUNCS}:generate",
        "--custom-rm-path", f"{SLIME_FUNCS}:reward", "--reward-key", "score",
        "--dynamic-sampling-filter-path", f"{SLIME_FUNCS}:keep_all",
        "--buffer-filter-path", f"{SLIME_FUNCS}:newest_first",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_jsonl(out / "rollouts.jsonl")
    assert len(rows) == 8
    for row in rows:
        check_sample(row)
        assert row["metadata"]["slime_style"] is True
        # the default engine names its model folder, so AutoTokenizer.from_pretrained(args.hf_checkpoint) works
        assert (Path(row["metadata"]["hf_checkpoint"]) / "tokenizer_config.json").exists()
        assert set(row["reward"]) == {"score", "length"}
    check_ledger(read_jsonl(out / "metrics.jsonl"))


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
def test_a_slime_example_folder_runs_unchanged_without_slime(tmp_path):
    """A generator written as slime's examples are (slime imports, sibling imports, GenerateState, post,
    slime's append_response_tokens with meta_info, deepcopy(args)), by file path, slime absent."""
    example = Path(__file__).parent / "slime_style" / "tool_example" / "generate_with_tool.py"
    out = tmp_path / "run"
    result = rlsdk("run", *TINY, "--num-rollout", "1", "--output", str(out),
                   "--custom-generate-function-path", f"{example}:generate",
                   "--custom-rm-path", f"{example}:reward_func")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_jsonl(out / "rollouts.jsonl")
    assert len(rows) == 4
    for row in rows:
        assert row["metadata"]["turns"] == 2 and row["status"] in ("completed", "truncated")
        assert "<tool>ok</tool>" in row["response"] and 0 in row["loss_mask"]
        assert len(row["loss_mask"]) == len(row["rollout_log_probs"]) == row["response_length"]
        assert row["reward"] in (0.0, 1.0)


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
def test_invalid_names_fail_before_the_model_loads(tmp_path):
    result = rlsdk("run", "--rm", "deepscalr", "--output", str(tmp_path), timeout=60)
    assert result.returncode != 0
    assert "Choose one of:" in result.stderr and "deepscaler" in result.stderr
    assert "plugin may not be installed" in result.stderr
    assert not (tmp_path / "rollouts.jsonl").exists()


@pytest.mark.plugins('rlsdk_embedded', 'rlsdk_rm_hub')
def test_eval_reports_pass_at_k_per_dataset(tmp_path):
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(line + "\n" for line in DEFAULT_DATASET.read_text().splitlines()[:3]))
    args = RolloutConfig(prompt_data=str(data), label_key="label", apply_chat_template=True,
                         eval_datasets=[{"name": "arith", "path": str(data), "n_samples_per_eval_prompt": 2,
                                         "eval_max_response_len": 12}],
                         eval_interval=1, num_rollout=1, rollout_batch_size=1, n_samples_per_prompt=2,
                         rollout_max_response_len=8, output_dir=str(tmp_path / "out"))
    run_job(args)
    evaluated = read_jsonl(tmp_path / "out" / "eval.jsonl")[0]
    assert evaluated["eval/arith/prompts"] == 3
    assert 0.0 <= evaluated["eval/arith/pass@1"] <= evaluated["eval/arith/pass@2"] <= 1.0


def test_the_collector_is_tuned_only_inside_the_block():
    """Startup objects frozen and young collections less often inside; Python's settings after."""
    import gc

    from rlsdk.runtime import YOUNG_COLLECTION_THRESHOLD, tuned_garbage_collector

    assert gc.get_freeze_count() == 0
    before = gc.get_threshold()
    with tuned_garbage_collector():
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_COLLECTION_THRESHOLD, *before[1:])
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before
