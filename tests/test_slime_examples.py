"""What slime's examples ask of rlsdk, on the tiny Llama with real training runs: its fully-async rollout path,
on-policy distillation in both of its modes (the teacher on a server, scored by slime's own reward and
post-process functions, and the teacher in the trainer), and the train/inference mismatch helper's pieces (a
custom TIS function importing slime's context-parallel utilities, its options from ``--custom-config-path``).
slime's own example files run from a slime checkout with ``scripts/slime_examples.py`` (docs/slime.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rlsdk import RolloutConfig
from rlsdk.run.job import run_job

pytestmark = pytest.mark.plugins("rlsdk_embedded", "rlsdk_rm_hub")


def metrics_of(out) -> list[dict]:
    return [json.loads(line) for line in (out.folder / "metrics.jsonl").read_text().splitlines()]


def training(tiny_llama, run_files, tmp_path, **options) -> RolloutConfig:
    data, reward = run_files
    values = {"model": str(tiny_llama), "prompt_data": str(data), "rm_type": reward, "train": True, "lr": 3e-2,
              "num_rollout": 2, "rollout_batch_size": 2, "n_samples_per_prompt": 4, "rollout_max_response_len": 4,
              "output_dir": str(tmp_path / "run"), "engine_threads": 1, "train_threads": 1, **options}
    return RolloutConfig.from_dict(values)


@pytest.fixture(scope="module")
def teacher_llama(tiny_llama, tmp_path_factory) -> Path:
    """The tiny Llama with other weights (the same vocabulary): a teacher that disagrees with the student."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("teacher")
    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    torch.manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.5 * torch.randn_like(param))
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_llama).save_pretrained(folder)
    return folder


def test_slimes_fully_async_rollout_path_trains_under_async(tiny_llama, run_files, tmp_path):
    """examples/fully_async: slime's rollout function path with rlsdk's ``--async`` (slime's train_async.py)."""
    args = training(tiny_llama, run_files, tmp_path, train_async=True,
                    rollout_function_path="slime.rollout.fully_async_rollout.generate_rollout_fully_async")
    rows = metrics_of(run_job(args))
    assert [r["rollout_id"] for r in rows] == [0, 1] and all(r["train/samples"] == 8 for r in rows)
    from slime.rollout.fully_async_rollout import generate_rollout_fully_async

    with pytest.raises(ValueError, match="doesn't support evaluation mode"):
        generate_rollout_fully_async(args, 0, None, evaluation=True)


def test_on_policy_distillation_with_slimes_teacher_server_functions(tiny_llama, teacher_llama, run_files, tmp_path):
    """examples/on_policy_distillation, sglang mode: the teacher on an SGLang-protocol server (``rlsdk
    serve``'s engine), slime's reward_func and post_process_rewards by their slime paths, ``--use-opd
    --opd-type sglang``; the teacher's log-probs are the server's scores of each sample's response tokens."""
    from rlsdk_embedded import EmbeddedEngine

    from rlsdk.testing import ServedEngine

    with ServedEngine(EmbeddedEngine(str(teacher_llama), device="cpu", threads=1)) as teacher:
        args = training(
            tiny_llama, run_files, tmp_path, use_opd=True, opd_type="sglang", opd_kl_coef=1.0,
            rm_type=None, custom_rm_path="slime.rollout.on_policy_distillation.reward_func",
            custom_reward_post_process_path="slime.rollout.on_policy_distillation.post_process_rewards",
            rm_url=f"{teacher.url}/generate",
        )
        out = run_job(args)
    rows = metrics_of(out)
    assert all(r["train/opd_reverse_kl"] > 0.1 and math.isfinite(r["train/grad_norm"]) for r in rows)
    sample = json.loads((out.folder / "rollouts.jsonl").read_text().splitlines()[0])
    assert "input_token_logprobs" in sample["reward"]["meta_info"]  # the teacher's answer; 0 after the post-process
    from transformers import AutoModelForCausalLM

    tokens, n = sample["tokens"], sample["response_length"]
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(teacher_llama)(torch.tensor([tokens])).logits[0].float()
    expected = torch.log_softmax(logits[-n - 1 : -1], -1).gather(1, torch.tensor(tokens[-n:])[:, None]).squeeze(1)
    torch.testing.assert_close(torch.tensor(sample["teacher_log_probs"]), expected, atol=1e-4, rtol=0)


def test_on_policy_distillation_with_the_teacher_in_the_trainer(tiny_llama, teacher_llama, run_files, tmp_path):
    """slime's megatron mode (``--opd-type megatron --opd-teacher-load``): the trainer loads the teacher
    beside the policy and scores the samples itself."""
    args = training(tiny_llama, run_files, tmp_path, use_opd=True, opd_type="megatron",
                    opd_teacher_load=str(teacher_llama))
    assert all(r["train/opd_reverse_kl"] > 0.1 for r in metrics_of(run_job(args)))


@pytest.mark.parametrize(
    ("options", "message"),
    [({"use_opd": True}, "--opd-type must be specified"),
     ({"use_opd": True, "opd_type": "megatron"}, "--opd-teacher-load is required"),
     ({"use_opd": True, "opd_type": "sglang", "opd_teacher_load": "t"}, "should not be set when --opd-type=sglang"),
     ({"opd_type": "sglang"}, "--use-opd is not enabled"),
     ({"use_opd": True, "opd_type": "ray"}, "opd_type must be one of sglang, megatron")],
)
def test_slimes_opd_settings_are_checked_as_slime_checks_them(options, message):
    with pytest.raises(ValueError, match=message):
        RolloutConfig(**options)


MIS = '''
import torch
from slime.backends.megatron_utils.cp_utils import all_gather_with_cp, slice_log_prob_with_cp


def truncated_is(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths,
                 response_lengths, **kwargs):
    """The mismatch helper's shape: gather each response over context-parallel ranks, weight, slice back."""
    weights, metrics = [], []
    for old, rollout, total, length in zip(train_log_probs, rollout_log_probs, total_lengths, response_lengths):
        ratio = torch.exp(all_gather_with_cp(old, total, length) - all_gather_with_cp(rollout, total, length))
        if args.tis_mode == "truncate":
            ratio = ratio.clamp(max=args.tis_upper_bound)
        weights.append(slice_log_prob_with_cp(ratio, total, length))
        metrics.append(slice_log_prob_with_cp(ratio, total, length))
    return pg_loss * torch.cat(weights), loss_masks, {"mis_is_weight": torch.cat(metrics)}
'''


def test_a_tis_function_with_slimes_cp_utils_and_its_custom_config(tiny_llama, run_files, tmp_path):
    """examples/train_infer_mismatch_helper's pieces: ``--use-tis`` with a custom TIS function that imports
    slime's context-parallel utilities, its settings from ``--custom-config-path`` (keys no option has)."""
    (tmp_path / "mis_fn.py").write_text(MIS)
    config = tmp_path / "mis.yaml"
    config.write_text("use_tis: true\ntis_mode: truncate\ntis_upper_bound: 2.0\n")
    with pytest.warns(UserWarning, match=r"\['tis_mode', 'tis_upper_bound'\] are no options"):
        args = training(tiny_llama, run_files, tmp_path, custom_config_path=str(config),
                        custom_tis_function_path=f"{tmp_path / 'mis_fn.py'}:truncated_is", num_steps_per_rollout=2)
    assert args.use_tis and args.tis_upper_bound == 2.0
    rows = metrics_of(run_job(args))
    assert all(0 < r["train/mis_is_weight"] <= 2.0 for r in rows)
