"""Steps with nothing to train on (T1, T2, T22) and labels that are no answer (D3). A run with ``--train``
on the tiny Llama (``tiny_llama`` in tests/conftest.py) in the embedded engine and the torch trainer, with
rewards that raise, return NaN or return 1e200 on every sample."""

from __future__ import annotations

import json
import re

import pytest

from rlsdk import RolloutConfig
from rlsdk.errors import RlsdkError
from rlsdk.run.job import run_job

pytestmark = pytest.mark.plugins("rlsdk_embedded", "rlsdk_rm_hub")

REWARDS = """
def raises(args, sample, **kwargs):
    raise RuntimeError("the grading service is down")

def not_a_number(args, sample, **kwargs):
    return float("nan")

def huge(args, sample, **kwargs):
    return 1e200 if sample.index % 2 else -1e200
"""


@pytest.fixture
def rewards(tmp_path):
    path = tmp_path / "bad_rewards.py"
    path.write_text(REWARDS)
    return path


@pytest.mark.parametrize(
    ("name", "cause"),
    [
        ("raises", "raised RuntimeError: the grading service is down"),
        ("not_a_number", "non-finite number nan"),
        ("huge", "outside +-1e+15"),
    ],
)
def test_a_step_with_only_invalid_rewards_stops_the_run_untrained(tiny_run, tmp_path, rewards, name, cause):
    args = tiny_run(rm_type=f"{rewards}:{name}", num_rollout=3, save_interval=1)
    with pytest.raises(RlsdkError) as error:
        run_job(args)
    message = str(error.value)
    assert re.match(r"step 0: all \d+ samples( it ran)? were dropped for an invalid reward", message), message
    assert f"bad_rewards.py:{name}" in message and cause in message, message
    assert "nothing was trained or checkpointed" in message
    out = tmp_path / "out"
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())
    [row] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # it stopped pulling once a batch's worth of groups had all failed, not after 8 x the batch
    assert row["ledger/entered"] <= 2 * (args.rollout_batch_size + args.over_sampling_batch_size)
    assert not any(key.startswith("train/") for key in row)


def test_dict_and_bool_labels_are_invalid_under_math_not_a_silent_zero():
    import asyncio

    from rlsdk import Sample, get_plugin_manager
    from rlsdk.plugins.calls import InvalidReward, call_reward

    resolved = get_plugin_manager().resolve("reward", "math")
    for label in ({"answer": "3"}, True, ["3", {"x": 1}]):
        sample = Sample(prompt="1 + 2 = ?", response="\\boxed{3}", label=label)
        with pytest.raises(InvalidReward, match="label is (dict|bool)"):
            asyncio.run(call_reward(resolved, RolloutConfig(), sample, timeout=30))
    right = Sample(prompt="1 + 2 = ?", response="\\boxed{3}", label="3")
    assert asyncio.run(call_reward(resolved, RolloutConfig(), right, timeout=30)) == 1.0
