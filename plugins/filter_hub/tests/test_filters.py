"""filter_hub's filters: contract checks from rlsdk.testing and edge cases (single samples, equal rewards,
dict rewards, invalid rewards)."""

from __future__ import annotations

import pytest
import rlsdk_filter_hub.plugin
from rlsdk import PluginCallError, RolloutConfig, Sample
from rlsdk import START_ROLLOUT_ID
from rlsdk.testing import (
    check_buffer_filter,
    check_dynamic_filter,
    check_over_sampling_filter,
    make_group,
)

DYNAMIC = [
    "check_reward_nonzero_std",
    "check_reward_nonzero_std_with_fallback",
    "check_metric_nonzero_std",
    "reward_range",
]
OVER_SAMPLING = ["sort_by_reward_std", "prefer_fewer_invalid"]
BUFFER = ["pop_first", "pop_last", "drop_stale"]


@pytest.fixture
def pm(rlsdk_pm):
    rlsdk_pm.register(rlsdk_filter_hub.plugin)
    return rlsdk_pm


def dapo(acc: bool | None) -> dict | None:
    return None if acc is None else {"score": 1.0 if acc else -1.0, "acc": acc, "pred": "x"}


def verdict(pm, name, rewards, **options):
    [result] = check_dynamic_filter(pm, name, RolloutConfig(**options), [make_group(rewards)])
    return result


# ----- contracts --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DYNAMIC)
def test_dynamic_filter_contract(pm, name):
    check_dynamic_filter(pm, name)
    dict_groups = [
        make_group([dapo(True), dapo(False)]),
        make_group([dapo(True)]),
        make_group([dapo(None)]),
        [],
    ]
    check_dynamic_filter(pm, name, RolloutConfig(reward_key="score"), dict_groups)


@pytest.mark.parametrize("name", OVER_SAMPLING)
def test_over_sampling_filter_contract(pm, name):
    check_over_sampling_filter(pm, name)
    groups = [make_group([dapo(True), dapo(None)], group_index=0), make_group([None], group_index=1)]
    check_over_sampling_filter(pm, name, RolloutConfig(reward_key="acc"), groups)


@pytest.mark.parametrize("name", BUFFER)
def test_buffer_filter_contract(pm, name):
    for num in (0, 2, 9):
        check_buffer_filter(pm, name, num_samples=num, may_drop=name == "drop_stale")


def test_every_filter_has_a_docstring_with_an_example(pm):
    for kind, names in (
        ("dynamic_filter", DYNAMIC),
        ("over_sampling_filter", OVER_SAMPLING),
        ("buffer_filter", BUFFER),
    ):
        assert sorted(pm.names(kind)) == sorted(names)
        for name in names:
            assert "Example:" in (pm.resolve(kind, name).func.__doc__ or ""), name


# ----- dynamic filters ---------------------------------------------------------------------------------


def test_nonzero_std_keeps_spread_and_names_the_drop(pm):
    assert verdict(pm, "check_reward_nonzero_std", [1.0, 0.0, 1.0, 1.0]).keep
    dropped = verdict(pm, "check_reward_nonzero_std", [1.0, 1.0, 1.0, 1.0])
    assert (dropped.keep, dropped.reason, dropped.keep_when_insufficient) == (False, "zero_std_1.0", False)
    assert verdict(pm, "check_reward_nonzero_std", [0.25, 0.25]).reason == "zero_std_0.2"


@pytest.mark.parametrize("rewards", [[1.0], [], [None, None], [None, 1.0], [float("nan"), 1.0]])
def test_nonzero_std_needs_two_valid_rewards(pm, rewards):
    result = verdict(pm, "check_reward_nonzero_std", rewards)
    assert (result.keep, result.reason) == (False, "too_few_valid_rewards")


def test_nonzero_std_ignores_invalid_rewards(pm):
    assert verdict(pm, "check_reward_nonzero_std", [None, 0.0, 1.0]).keep
    assert not verdict(pm, "check_reward_nonzero_std", [None, 1.0, 1.0]).keep


def test_nonzero_std_reads_dict_rewards_at_reward_key(pm):
    assert verdict(pm, "check_reward_nonzero_std", [dapo(True), dapo(False)], reward_key="score").keep
    assert (
        verdict(pm, "check_reward_nonzero_std", [dapo(True), dapo(True)], reward_key="score").reason
        == "zero_std_1.0"
    )
    with pytest.raises(PluginCallError, match="check_reward_nonzero_std.*raised KeyError.*reward-key"):
        verdict(pm, "check_reward_nonzero_std", [dapo(True), dapo(False)])


def test_fallback_marks_dropped_groups_usable_when_insufficient(pm):
    kept = verdict(pm, "check_reward_nonzero_std_with_fallback", [0.0, 1.0])
    assert kept.keep and not kept.keep_when_insufficient
    dropped = verdict(pm, "check_reward_nonzero_std_with_fallback", [0.0, 0.0])
    assert (dropped.keep, dropped.reason, dropped.keep_when_insufficient) == (False, "zero_std_0.0", True)
    single = verdict(pm, "check_reward_nonzero_std_with_fallback", [None])
    assert (single.keep, single.keep_when_insufficient) == (False, True)


def test_metric_filter_sees_accuracy_not_the_shaped_score(pm):
    # same accuracy, different shaped score (e.g. an overlong penalty): the metric filter drops it
    shaped = [{"score": 1.0, "acc": True}, {"score": 0.5, "acc": True}]
    assert verdict(pm, "check_reward_nonzero_std", shaped, reward_key="score").keep
    result = verdict(pm, "check_metric_nonzero_std", shaped, reward_key="score")
    assert (result.keep, result.reason) == (False, "zero_std_acc_1.0")
    assert verdict(pm, "check_metric_nonzero_std", [dapo(True), dapo(False), dapo(None)]).keep
    assert verdict(
        pm,
        "check_metric_nonzero_std",
        [{"score": 1, "ok": 1}, {"score": 1, "ok": 0}],
        dynamic_filter_metric_key="ok",
    ).keep
    assert verdict(pm, "check_metric_nonzero_std", [0.0, 1.0]).keep  # a float reward is its own metric
    with pytest.raises(PluginCallError, match="raised KeyError.*acc"):
        verdict(pm, "check_metric_nonzero_std", [{"score": 1.0}, {"score": 0.0}])


def test_reward_range_bounds_are_exclusive(pm):
    assert verdict(pm, "reward_range", [1.0, 0.0, 0.0]).keep
    assert verdict(pm, "reward_range", [0.0, 0.0]).reason == "mean_le_min"
    assert verdict(pm, "reward_range", [1.0, 1.0]).reason == "mean_ge_max"
    assert verdict(pm, "reward_range", [0.5]).keep  # one sample is enough for a mean
    assert verdict(pm, "reward_range", [None, None]).reason == "no_valid_rewards"
    assert verdict(pm, "reward_range", [None, 1.0, 0.0]).keep
    assert verdict(pm, "reward_range", [1.0, 1.0], reward_range_max=1.5).keep
    assert not verdict(pm, "reward_range", [0.2, 0.3], reward_range_min=0.25).keep
    assert verdict(pm, "reward_range", [dapo(True), dapo(False)], reward_key="acc").keep


# ----- over-sampling filters ---------------------------------------------------------------------------


def indices(groups):
    return [g[0].group_index for g in groups]


def groups_of(*rewards):
    return [make_group(r, group_index=i) for i, r in enumerate(rewards)]


def test_sort_by_reward_std_is_stable_and_descending(pm):
    f = pm.resolve("over_sampling_filter", "sort_by_reward_std").func
    args = RolloutConfig()
    groups = groups_of([1.0, 1.0], [0.0, 1.0], [None], [0.5, 0.5], [0.0, 1.0, 1.0], [1.0], [1.0, 0.0])
    # std: 0, 0.5, none, 0, 0.47, 0 (single), 0.5
    assert indices(f(args, groups)) == [1, 6, 4, 0, 3, 5, 2]
    dict_groups = groups_of([dapo(True), dapo(True)], [dapo(True), dapo(False)])
    assert indices(f(RolloutConfig(reward_key="score"), dict_groups)) == [1, 0]
    assert f(args, []) == []


def test_prefer_fewer_invalid(pm):
    f = pm.resolve("over_sampling_filter", "prefer_fewer_invalid").func
    groups = groups_of([None, None], [1.0, None], [0.0, 1.0], [float("nan"), 1.0], [1.0])
    groups[2][0].status = Sample.Status.FAILED
    assert indices(f(RolloutConfig(), groups)) == [4, 1, 2, 3, 0]
    dict_groups = groups_of(
        [dapo(None), dapo(True)], [{"acc": None}, {"acc": True}], [dapo(True), dapo(False)]
    )
    assert indices(f(RolloutConfig(), dict_groups)) == [1, 2, 0]  # without reward_key only None is invalid
    assert indices(f(RolloutConfig(reward_key="acc"), dict_groups)) == [2, 0, 1]


# ----- buffer filters ----------------------------------------------------------------------------------


def buffered(*starts):
    groups = groups_of(*[[1.0, 0.0]] * len(starts))
    for group, start in zip(groups, starts):
        if start is not None:
            for sample in group:
                sample.metadata[START_ROLLOUT_ID] = start
    return groups


def test_pop_first_and_pop_last(pm):
    args = RolloutConfig()
    buffer = buffered(None, None, None)
    assert indices(pm.resolve("buffer_filter", "pop_first").func(args, 0, buffer, 2)) == [0, 1]
    assert indices(buffer) == [2]
    buffer = buffered(None, None, None)
    assert indices(pm.resolve("buffer_filter", "pop_last").func(args, 0, buffer, 2)) == [2, 1]
    assert indices(buffer) == [0]
    assert indices(pm.resolve("buffer_filter", "pop_last").func(args, 0, buffer, 5)) == [0]
    assert buffer == []


def test_drop_stale_drops_old_groups_and_serves_oldest_first(pm):
    f = pm.resolve("buffer_filter", "drop_stale").func
    args = RolloutConfig(buffer_max_staleness=2)
    buffer = buffered(2, 4, 3, None, 3)
    assert indices(f(args, 5, buffer, 2)) == [2, 4]  # group 0 (5 - 2 > 2) dropped; ties keep buffer order
    assert indices(buffer) == [1, 3]
    assert indices(f(args, 5, buffer, 0)) == []
    assert indices(f(args, 7, buffer, 5)) == [3]  # group 1 (started 4) is now too old; 3 has no start
    assert buffer == []


def test_drop_stale_without_limit_keeps_everything(pm):
    f = pm.resolve("buffer_filter", "drop_stale").func
    buffer = buffered(9, 0, 5)
    assert indices(f(RolloutConfig(), 100, buffer, 2)) == [1, 2]
    assert indices(buffer) == [0]


def test_drop_stale_uses_the_earliest_start_in_a_group(pm):
    f = pm.resolve("buffer_filter", "drop_stale").func
    buffer = buffered(5, 4)
    buffer[0][1].metadata[START_ROLLOUT_ID] = 1
    assert indices(f(RolloutConfig(buffer_max_staleness=3), 5, buffer, 2)) == [1]
    assert buffer == []


def test_filter_hub_is_listed_as_installed():
    from rlsdk_cli.plugins import _manager, plugin_rows

    rows = {row["entry_point"]: row for row in plugin_rows(_manager())}
    assert rows["filter_hub"]["distribution"] == "rlsdk-filter-hub"
    assert rows["filter_hub"]["provides"]["buffer_filter"] == [
        "drop_stale",
        "pop_last",
    ]  # pop_first is core's
