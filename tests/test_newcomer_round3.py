"""What a newcomer and a plugin author hit, round 3 (issue 41): the settings a run uses and where they come
from, a step whose every reward is invalid, eval sets by name, plugin-name typos, a missing input key,
evals before training, checkpoint retention, eval of a checkpoint, and response text without the stop token.

Generation runs on rlsdk.testing's FakeEngine (``test_rollout_loop``'s fixture) where a model would only
add minutes; the run with checkpoints trains the tiny Llama of conftest.py for real."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from rlsdk import Reward, RolloutConfig, hookimpl
from rlsdk.errors import DataError, RlsdkError, UnknownPluginError
from rlsdk.run.job import check_data, check_step, run_job
from rlsdk.testing import ByteTokenizer, check_custom_generate
from rlsdk.training.session import prune_checkpoints
from rlsdk_cli.app import app
from rlsdk_cli.run import configure, eval_dataset
from rlsdk_cli.settings import setting_sources, summary_lines, with_checkpoint_settings

from . import test_rollout_loop as loop
from .conftest import tiny_train_args

runner = CliRunner()
make_run, step = loop.make_run, loop.step


def config_of(argv: list[str]) -> tuple[str, dict]:
    result = runner.invoke(app, ["run", *argv, "--print-config"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.stdout, yaml.safe_load(result.stdout)


def test_print_config_says_which_settings_the_demo_sets_and_works_as_a_config(tmp_path):
    text, values = config_of(["--train"])
    assert "lr: 1.0e-05  # demo" in text and "label_key: label  # demo" in text
    assert "train: true  # given" in text and "eps_clip: 0.2\n" in text  # a default: no comment
    RolloutConfig.from_dict(values)  # the output is a valid config

    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"input": "1 + 1 = ?", "label": "2"}) + "\n")
    text, values = config_of(["--train", "--data", str(data)])
    assert f"prompt_data: {data}  # given" in text
    assert values["lr"] == 1e-6 and values["label_key"] is None and values["eval_datasets"] == []
    assert "# demo" not in text


def test_the_start_up_summary_names_the_demo_settings_that_data_turns_off(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"input": "1 + 1 = ?", "label": "2"}) + "\n")
    options = {"train": True, "prompt_data": str(data)}
    args, given = configure(None, options, [])
    lines = summary_lines(args, setting_sources(args, given))
    text = "\n".join(lines)
    assert "label_key = None  (default)" in text and f"prompt_data = {data}  (given)" in text
    assert re.search(r"with --data the demo's settings do not apply: label_key None \(demo label\);.*"
                     r"num_rollout 3 \(demo 16\);.*lr 1e-06 \(demo 1e-05\)", text), text


class Rewards:
    @hookimpl
    def rlsdk_rewards(self):
        def needs_label(args, sample, **kwargs):
            """Raises without a label, as the math reward does."""
            if sample.label is None:
                raise ValueError("the sample has no label: name the data's answer key with --label-key")
            return 1.0

        yield Reward(name="needs_label", func=needs_label)


def test_a_step_whose_every_reward_is_invalid_stops_the_run_with_the_cause(make_run, rlsdk_pm):
    rlsdk_pm.register(Rewards())
    args, source, runtime, _ = make_run(n_prompts=2, rm_type="needs_label", label_key=None,
                                        rollout_max_groups_per_step=2)
    metrics = step(args, source, runtime).metrics
    assert metrics["rollout/dynamic_filter/drop_invalid_reward"] == 4 and metrics["ledger/kept"] == 0
    with pytest.raises(RlsdkError, match=r"step 0: all 4 samples were dropped for an invalid reward \(reward "
                                         r"'needs_label' .*the sample has no label: name the data's answer key "
                                         r"with --label-key\); nothing was trained or checkpointed, the samples "
                                         r"are in discarded.jsonl"):
        check_step(args, 0, metrics)
    check_step(args.replace(on_failed_step="continue"), 0, metrics)  # asked to go on: it goes on


def test_eval_data_takes_a_shipped_name_or_a_file_and_else_says_what_it_takes(tmp_path):
    assert eval_dataset("arithmetic-eval")["path"].endswith("datasets/arithmetic-eval.jsonl")
    data = tmp_path / "held.jsonl"
    data.write_text("{}\n")
    assert eval_dataset(str(data)) == {"name": "held", "path": str(data)}
    assert eval_dataset("x=y.jsonl") == {"name": "x", "path": "y.jsonl"}
    with pytest.raises(typer.BadParameter, match=r"is not NAME=PATH, a data file or a shipped dataset \(shipped: "
                                                 r"arithmetic-eval, "):
        eval_dataset("arithmetic-evl")
    for command in ("run", "eval"):
        result = runner.invoke(app, [command, "--eval-data", "arithmetic-evl"], env={"COLUMNS": "200"})
        assert result.exit_code == 2 and "Traceback" not in result.output and "shipped" in result.output


def test_a_misspelled_plugin_name_gets_a_did_you_mean(rlsdk_pm):
    with pytest.raises(UnknownPluginError, match=r"unknown buffer_filter 'pop_frist' \(did you mean 'pop_first'\?\)\. "
                                                 r"Choose one of"):
        rlsdk_pm.resolve("buffer_filter", "pop_frist")


def test_a_missing_input_key_and_an_unnamed_label_are_found_before_any_model_loads(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"question": "1 + 1 = ?", "label": "2"}) + "\n")
    with pytest.raises(DataError, match=r"rows.jsonl:line 1: no input key 'input' \(keys: \['label', 'question'\]"):
        check_data(RolloutConfig(prompt_data=str(data)))
    with pytest.warns(UserWarning, match="has a 'label' key but no --label-key is set"):
        check_data(RolloutConfig(prompt_data=str(data), input_key="question"))


def test_resume_and_overwrite_together_are_refused():
    result = runner.invoke(app, ["run", "--resume", "--overwrite"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "--resume continues the run" in result.output


def test_keep_last_n_removes_the_oldest_checkpoints(tmp_path):
    for n in (0, 1, 2, 10):
        (tmp_path / f"step_{n}").mkdir()
    (tmp_path / ".step_11.tmp").mkdir()
    assert [p.name for p in prune_checkpoints(tmp_path, 2)] == ["step_0", "step_1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".step_11.tmp", "step_10", "step_2"]
    with pytest.raises(ValueError, match="keep_last_n must be at least 1"):
        RolloutConfig(keep_last_n=0)


@pytest.mark.plugins("rlsdk_embedded")
def test_a_training_run_skips_the_first_eval_times_its_evals_keeps_two_checkpoints_and_its_eval_reads_them(
    tiny_llama, run_files, tmp_path
):
    out = tmp_path / "out"
    data, _ = run_files
    rows = [json.loads(line) for line in data.read_text().splitlines()]  # labelled: --label-key names a column
    data.write_text("".join(json.dumps({**row, "label": row["input"].split()[-1]}) + "\n" for row in rows))
    args = tiny_train_args(tiny_llama, run_files, out, num_rollout=3, save_interval=1, keep_last_n=2, eval_interval=2,
                      skip_eval_before_train=True, label_key="label",
                      eval_datasets=[{"name": "held", "path": str(data)}], n_samples_per_eval_prompt=1)
    statuses, progress = [], []
    run_job(args, on_status=statuses.append, progress=lambda n: progress.append((statuses[-1], n)))
    evals = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert [e["rollout_id"] for e in evals] == [1, 2] and all(e["eval/seconds"] > 0 for e in evals)
    assert sum(n for status, n in progress if status == "eval after step 1") == 16  # every eval sample counted
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_1", "step_2"]

    checkpoint = out / "checkpoints" / "step_2"
    options = {"model": str(checkpoint), "rm_type": "math"}
    evaluated, given = configure(None, options, [])
    evaluated, taken = with_checkpoint_settings(evaluated, given)
    assert "eval_datasets" in taken and "rm_type" not in taken
    assert evaluated.eval_datasets == [{"name": "held", "path": str(data)}] and evaluated.label_key == "label"
    assert evaluated.rm_type == "math" and evaluated.prompt_data == str(data)


class EndOfTurnTokenizer(ByteTokenizer):
    """Bytes, with ``<|im_end|>`` one token (id 256) as in SmolLM2's vocabulary."""

    eos_token = "<|im_end|>"

    def __call__(self, text, add_special_tokens=False):
        parts = text.split(self.eos_token)
        ids = [i for part in parts for i in [*part.encode(), 256]][:-1]
        return {"input_ids": ids}

    def decode(self, ids):
        return "".join(self.eos_token if i == 256 else bytes([i]).decode(errors="replace") for i in ids)


def test_the_response_text_leaves_the_stop_token_out_and_the_token_ids_keep_it(rlsdk_pm):
    """As SGLang's reference response (stop_token case: text "" for the one matched id) does."""
    recorded = json.loads((Path(__file__).parent / "fixtures" / "sglang-0.5.17.json").read_text())["stop_token"][1]
    assert recorded["text"] == "" and recorded["output_ids"] == [recorded["meta_info"]["finish_reason"]["matched"]]
    sample = check_custom_generate(rlsdk_pm, "single_turn", ["The answer is 5.<|im_end|>"],
                                   tokenizer=EndOfTurnTokenizer())
    assert sample.response == "The answer is 5." and sample.tokens[-1] == 256


@pytest.mark.plugins("rlsdk_filter_hub")
def test_groups_the_buffer_filter_drops_are_counted_and_written_out(make_run):
    args, source, runtime, _ = make_run(n_prompts=6, buffer_filter_path="drop_stale", buffer_max_staleness=1)
    stale = source.get_samples(2, rollout_id=0)
    source.add_samples(stale, rollout_id=0)
    out = step(args, source, runtime, rollout_id=5)
    assert out.metrics["rollout/dynamic_filter/drop_buffer_filter_drop_stale"] == 4
    assert out.metrics["ledger/dropped"] == 4 and out.metrics["ledger/kept"] == 4
    dropped = [s for g in out.discarded for s in g if s.metadata.get("drop_reason") == "buffer_filter_drop_stale"]
    assert sorted(s.index for s in dropped) == [s.index for g in stale for s in g]


def test_curves_show_what_people_read_with_the_run_name_and_the_legend_off_the_data(tmp_path):
    from rlsdk.report import RunReport

    folder = tmp_path / "my-run"
    folder.mkdir()
    rows = [{"rollout_id": i, "rollout/reward_mean": 0.5 + i / 20, "train/ppo_kl": 1e-3 * i, "train/kl_loss": 2e-3,
             "train/entropy_loss": 1.0 - i / 20, "rollout/response_len_mean": 30 - i, "train/pg_clipfrac": 0.01 * i,
             "train/loss": 1e-3} for i in range(8)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = [{"rollout_id": i, "eval/arithmetic-eval/reward_mean": 0.6 + i / 40} for i in (-1, 3, 7)]
    (folder / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    report = RunReport(folder)
    fig = report.figure()
    assert fig._suptitle.get_text() == "rlsdk run: my-run"
    reward, *panels = fig.axes
    assert [a.get_title() for a in panels] == ["KL", "entropy", "response length (tokens)", "clip fraction"]
    assert [line.get_label() for line in reward.get_lines()] == ["train reward (sampled, kept groups)",
                                                                  "arithmetic-eval (eval)"]
    fig.canvas.draw()
    legend = reward.get_legend().get_window_extent()
    assert legend.y0 >= reward.get_window_extent().y1  # above the axes, on no data
    assert not any("loss" == a.get_title() for a in fig.axes)
    report.draw()
    assert (folder / "curves.png").stat().st_size > 0


def test_resuming_a_finished_run_says_so_without_loading_a_model(tmp_path):
    from rlsdk.outputs import STATE_FILE
    from rlsdk.run.output import saved_settings

    args = RolloutConfig(prompt_data=str(tmp_path / "rows.jsonl"), num_rollout=2, output_dir=str(tmp_path))
    (tmp_path / STATE_FILE).write_text(json.dumps({"next_rollout_id": 2, "settings": saved_settings(args)}))
    result = runner.invoke(app, ["run", "--resume", "--output", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "is finished (2 of 2 steps): --resume --num-rollout N continues it" in result.output


def test_run_help_shows_no_sphinx_markup():
    from rlsdk.config import core_options

    assert not [name for name, option in core_options().items() if re.search(r":\w+:`", option.help)]
    result = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert ":meth:" not in result.output and "--print-config" in result.output


def test_the_command_prints_a_warning_on_one_line():
    from rlsdk_cli.app import one_line_warning

    assert one_line_warning(UserWarning("rows.jsonl has a 'label' key"), UserWarning, "job.py", 42) == (
        "UserWarning: rows.jsonl has a 'label' key\n"
    )


def test_without_a_terminal_progress_is_a_line_now_and_then(capsys):
    from rlsdk_cli.run import ProgressLines

    lines = ProgressLines(every=0.0)
    lines.reset("eval before the first step")
    lines.advance(8)
    lines.advance(8)
    err = capsys.readouterr().err
    assert "eval before the first step: 8 samples done in" in err and "16 samples done" in err
