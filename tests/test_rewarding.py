"""score_group: precedence, isolation of bad rewards, group rewards, boxed_ prefix, reward keys, and
the invalid-reward policy. Rewards are small inline plugins."""

import asyncio
import time

import pytest

from rlsdk.testing import score
from rlsdk import PluginCallError, PluginError, Reward, RolloutConfig, Sample, hookimpl
from rlsdk.rollout.rewarding import REWARD_ERROR, apply_invalid_policy, count_invalid


def exact(args, sample, **kwargs):
    return float(sample.response == sample.label)


async def length(args, sample, **kwargs):
    return float(len(sample.response))


def crash(args, sample, **kwargs):
    raise ValueError("kaboom")


def wrong_type(args, sample, **kwargs):
    return "1.0"


def hang_sync(args, sample, **kwargs):
    time.sleep(3)
    return 1.0


async def hang_async(args, sample, **kwargs):
    await asyncio.sleep(30)


def as_dict(args, sample, **kwargs):
    return {"score": 1.0, "acc": True}


def ranks(args, samples, **kwargs):
    return [float(i) for i in range(len(samples))]


def short_list(args, samples, **kwargs):
    return [1.0]


class Plugin:
    @hookimpl
    def rlsdk_rewards(self):
        for func in (exact, length, crash, wrong_type, hang_sync, hang_async, as_dict):
            yield Reward(name=func.__name__, func=func)
        yield Reward(name="ranks", func=ranks, group=True)
        yield Reward(name="short_list", func=short_list, group=True)


@pytest.fixture
def pm(rlsdk_pm):
    rlsdk_pm.register(Plugin(), "inline")
    return rlsdk_pm


def group(n=3, response="5", label="5", **fields):
    return [Sample(group_index=7, index=i, response=response, label=label, status=Sample.Status.COMPLETED,
                   **fields) for i in range(n)]


def run(pm, samples, evaluation=False, **options):
    args = RolloutConfig(**{"rm_type": "exact", "reward_timeout": 0.5, **options})
    score(pm, samples, args, evaluation=evaluation)
    return samples


def test_sync_and_async(pm):
    assert [s.reward for s in run(pm, group())] == [1.0] * 3
    assert [s.reward for s in run(pm, group(), rm_type="length")] == [1.0] * 3


def test_precedence(pm):
    samples = group(4)
    samples[0].custom_rm_path = f"{__file__}:length"
    samples[1].metadata["rm_type"] = "length"
    samples[2].metadata["rm_type"] = "crash"
    run(pm, samples, custom_rm_path=None)
    assert [s.reward for s in samples[:2]] == [1.0, 1.0] and samples[3].reward == 1.0
    assert samples[2].reward is None
    overridden = run(pm, group(2), custom_rm_path=f"{__file__}:length", rm_type="crash")
    assert [s.reward for s in overridden] == [1.0, 1.0]


@pytest.mark.parametrize("name,reason", [
    ("crash", "ValueError: kaboom"), ("wrong_type", "returned str"),
    ("hang_sync", "timed out after 0.5s"), ("hang_async", "timed out after 0.5s"),
])
def test_bad_reward_marks_sample_invalid(pm, name, reason):
    samples = run(pm, group(2), rm_type=name)
    for sample in samples:
        assert sample.reward is None and sample.status is Sample.Status.FAILED
        error = sample.metadata[REWARD_ERROR]
        assert reason in error and repr(name) in error and "plugin 'inline'" in error and "index=" in error
    assert count_invalid(samples) == 2


def test_unknown_reward_raises_before_any_work(pm):
    samples = group(2)
    samples[1].metadata["rm_type"] = "nope"
    with pytest.raises(PluginError, match="Choose one of"):
        run(pm, samples)
    assert samples[0].reward is None and REWARD_ERROR not in samples[0].metadata


def test_group_reward_called_once_with_the_list(pm):
    assert [s.reward for s in run(pm, group(4), rm_type="ranks")] == [0.0, 1.0, 2.0, 3.0]
    dotted = run(pm, group(3), custom_rm_path=f"{__file__}:ranks", group_rm=True)
    assert [s.reward for s in dotted] == [0.0, 1.0, 2.0]
    bad = run(pm, group(3), rm_type="short_list")
    assert all("expected a list of 3" in s.metadata[REWARD_ERROR] for s in bad)


def test_boxed_prefix_wraps_any_reward(pm):
    samples = group(2, response="so \\boxed{5}")
    samples[1].response = "5 without a box"
    run(pm, samples, rm_type="boxed_exact")
    assert [s.reward for s in samples] == [1.0, 0.0]
    assert samples[0].response == "so \\boxed{5}"  # the sample itself is not changed


def test_reward_keys(pm):
    samples = run(pm, group(1), rm_type="as_dict", reward_key="score")
    assert samples[0].get_reward_value(RolloutConfig(reward_key="score")) == 1.0
    with pytest.raises(PluginError, match=r"'as_dict'.*\['acc', 'score'\].*'missing'"):
        run(pm, group(1), rm_type="as_dict", reward_key="missing")
    run(pm, group(1), evaluation=True, rm_type="as_dict", reward_key="missing", eval_reward_key="acc")
    with pytest.raises(PluginError, match="'nope'"):
        run(pm, group(1), evaluation=True, rm_type="as_dict", reward_key="score", eval_reward_key="nope")


def test_invalid_policy(pm):
    args = RolloutConfig()
    assert apply_invalid_policy(args, run(pm, group(2))) is None
    with pytest.raises(PluginCallError, match="kaboom"):
        apply_invalid_policy(args.replace(on_invalid_reward="fail"), run(pm, group(2), rm_type="crash"))
    assert apply_invalid_policy(args, run(pm, group(2), rm_type="crash")) == "invalid_reward"
    scored = run(pm, group(2), rm_type="crash")
    assert apply_invalid_policy(args.replace(on_invalid_reward="score", invalid_reward_value=-1.0), scored) is None
    assert [s.reward for s in scored] == [-1.0, -1.0]
    assert all(s.status is Sample.Status.COMPLETED for s in scored) and count_invalid(scored) == 2


def test_cheap_rewards_run_inline_and_still_mark_bad_results(rlsdk_pm):
    import threading

    threads = []

    def cheap_exact(args, sample, **kwargs):
        threads.append(threading.current_thread())
        return float(sample.response == sample.label)

    class Cheap:
        @hookimpl
        def rlsdk_rewards(self):
            yield Reward(name="cheap_exact", func=cheap_exact, cheap=True)
            yield Reward(name="cheap_crash", func=crash, cheap=True)

    rlsdk_pm.register(Cheap(), "cheap")
    assert [s.reward for s in run(rlsdk_pm, group(), rm_type="cheap_exact")] == [1.0] * 3
    assert threads == [threading.main_thread()] * 3  # on the event loop, no worker thread
    samples = run(rlsdk_pm, group(2), rm_type="cheap_crash")
    assert all(s.reward is None and "ValueError: kaboom" in s.metadata[REWARD_ERROR] for s in samples)
    with pytest.raises(ValueError, match="cheap=True is for plain functions"):
        Reward(name="async_cheap", func=length, cheap=True)
