"""The data source: groups and indices, epochs and shuffling, the buffer and its filter, state, eval."""

from __future__ import annotations

import json

import pytest

from rlsdk import BufferFilter, RolloutConfig, Sample, hookimpl
from rlsdk.data import START_ROLLOUT_ID, DataSource
from rlsdk.errors import PluginCallError, PluginError


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(
        "".join(
            json.dumps({"input": f"p{i}", "label": str(i), "metadata": {"i": i}}) + "\n" for i in range(5)
        )
    )
    return path


def make(pm, data, **options):
    return DataSource(RolloutConfig(prompt_data=str(data), label_key="label", **options), pm=pm)


def names(groups):
    return [g[0].prompt for g in groups]


def test_groups_have_copies_with_group_and_sample_indices(pm, data):
    ds = make(pm, data, n_samples_per_prompt=3)
    groups = ds.get_samples(2)
    assert [[(s.group_index, s.index, s.prompt, s.label) for s in g] for g in groups] == [
        [(0, 0, "p0", "0"), (0, 1, "p0", "0"), (0, 2, "p0", "0")],
        [(1, 3, "p1", "1"), (1, 4, "p1", "1"), (1, 5, "p1", "1")],
    ]
    first = groups[0]
    assert all(s.status == Sample.Status.PENDING and s.tokens == [] for s in first)
    first[0].metadata["x"] = 1  # copies never share mutable fields
    assert first[1].metadata == {"i": 0}
    assert ds.get_samples(0) == []
    with pytest.raises(ValueError):
        ds.get_samples(-1)


def test_epochs_without_shuffle_repeat_the_file_order(pm, data):
    ds = make(pm, data, n_samples_per_prompt=1)
    assert names(ds.get_samples(7)) == ["p0", "p1", "p2", "p3", "p4", "p0", "p1"]
    assert ds.metrics()["epoch"] == 1
    assert [g[0].group_index for g in ds.get_samples(2)] == [7, 8]


def test_shuffle_is_seeded_by_rollout_seed_and_epoch(pm, data):
    def epochs(seed):
        return names(
            make(pm, data, n_samples_per_prompt=1, rollout_shuffle=True, rollout_seed=seed).get_samples(15)
        )

    first, again, other = epochs(1), epochs(1), epochs(2)
    assert first == again and first != other
    blocks = [first[i : i + 5] for i in (0, 5, 10)]
    assert all(
        sorted(b) == [f"p{i}" for i in range(5)] for b in blocks
    )  # each epoch covers every prompt once
    assert len({tuple(b) for b in blocks}) > 1  # and the order changes with the epoch


def test_buffer_is_served_first_through_the_filter(pm, data):
    ds = make(pm, data, n_samples_per_prompt=2)
    groups = ds.get_samples(3, rollout_id=4)
    groups[1][0].response = "partial"
    ds.add_samples(groups[1:])
    assert ds.get_buffer_length() == 2
    assert all(s.metadata[START_ROLLOUT_ID] == 4 for g in groups[1:] for s in g)
    served = ds.get_samples(3, rollout_id=5)
    assert names(served) == ["p1", "p2", "p3"]
    assert served[0][0].response == "partial" and served[0][0].group_index == 1
    assert served[2][0].group_index == 3
    metrics = ds.metrics()
    assert (metrics["groups_served_fresh"], metrics["groups_served_from_buffer"], metrics["buffer_size"]) == (
        4,
        2,
        0,
    )


def test_add_samples_keeps_an_earlier_start_and_takes_an_explicit_step(pm, data):
    ds = make(pm, data, n_samples_per_prompt=1)
    a, b = ds.get_samples(2, rollout_id=3)
    a[0].metadata[START_ROLLOUT_ID] = 1  # set by a partial rollout earlier
    ds.add_samples([a, b], rollout_id=7)
    assert (a[0].metadata[START_ROLLOUT_ID], b[0].metadata[START_ROLLOUT_ID]) == (1, 7)
    with pytest.raises(TypeError, match="group 1"):
        ds.add_samples([a, []])
    with pytest.raises(TypeError, match="group 0"):
        ds.add_samples([a[0]])
    assert ds.get_buffer_length() == 2  # nothing added by the failed calls


@pytest.mark.plugins("rlsdk_filter_hub")
def test_pop_last_and_staleness_filters_from_the_hub(pm, data):
    ds = make(pm, data, n_samples_per_prompt=1, buffer_filter_path="pop_last")
    ds.add_samples(ds.get_samples(3))
    assert names(ds.get_samples(2)) == ["p2", "p1"]

    ds = make(pm, data, n_samples_per_prompt=1, buffer_filter_path="drop_stale", buffer_max_staleness=1)
    ds.add_samples(ds.get_samples(2, rollout_id=0))
    ds.add_samples(ds.get_samples(1, rollout_id=1))  # p2 enters at step 1
    assert names(ds.get_samples(2, rollout_id=2)) == ["p2", "p3"]  # p0, p1 (step 0) are too old
    assert ds.metrics()["buffer_groups_dropped"] == 2


class Misbehaving:
    """Buffer filters that break the contract, to check the data source catches it."""

    @hookimpl
    def rlsdk_buffer_filters(self):
        yield BufferFilter(name="raises", func=lambda args, rollout_id, buffer, num_samples: 1 / 0)
        yield BufferFilter(name="too_many", func=lambda args, rollout_id, buffer, num_samples: list(buffer))
        yield BufferFilter(name="keeps_served", func=lambda args, rollout_id, buffer, num_samples: buffer[:1])
        yield BufferFilter(name="not_a_list", func=lambda args, rollout_id, buffer, num_samples: None)


@pytest.mark.parametrize(
    "name,problem",
    [
        ("raises", "raised ZeroDivisionError"),
        ("too_many", "returned 3 groups when asked for at most 2"),
        ("keeps_served", "left served groups in the buffer"),
        ("not_a_list", "returned NoneType"),
    ],
)
def test_a_broken_buffer_filter_is_named_and_loses_nothing(pm, data, name, problem):
    pm.register(Misbehaving())
    ds = make(pm, data, n_samples_per_prompt=1, buffer_filter_path=name)
    ds.add_samples(ds.get_samples(3))
    with pytest.raises(PluginCallError, match=f"buffer_filter '{name}' .*{problem}.*the buffer is unchanged"):
        ds.get_samples(2)
    assert names(ds.buffer) == ["p0", "p1", "p2"]


@pytest.mark.plugins("rlsdk_filter_hub")
def test_unknown_buffer_filter_fails_at_construction(pm, data):
    with pytest.raises(PluginError, match="Choose one of: drop_stale, pop_first, pop_last"):
        make(pm, data, buffer_filter_path="pop_random")


def test_state_is_json_and_restores_buffer_and_position(pm, data, tmp_path):
    ds = make(pm, data, n_samples_per_prompt=2, rollout_shuffle=True)
    groups = ds.get_samples(4, rollout_id=0)
    groups[0][0].append_response_tokens([5, 6], [-0.5, -0.25])
    groups[0][0].reward = {"score": 1.0, "acc": True}
    groups[0][0].status = Sample.Status.ABORTED
    ds.add_samples(groups[:2])
    ds.save(tmp_path / "state" / "data.json")
    expected = ds.get_samples(8, rollout_id=1)

    resumed = make(pm, data, n_samples_per_prompt=2, rollout_shuffle=True)
    resumed.load(tmp_path / "state" / "data.json")
    assert resumed.get_samples(8, rollout_id=1) == expected
    assert expected[0][0].status == Sample.Status.ABORTED and expected[0][0].rollout_log_probs == [
        -0.5,
        -0.25,
    ]
    assert resumed.metrics() == ds.metrics()


def test_state_dict_is_a_snapshot_and_rejects_what_json_cannot_hold(pm, data):
    ds = make(pm, data, n_samples_per_prompt=1)
    group = ds.get_samples(1)[0]
    ds.add_samples([group])
    state = ds.state_dict()
    group[0].response = "changed later"
    assert state["buffer"][0][0]["response"] == ""
    group[0].metadata["bad"] = object()
    with pytest.raises(Exception, match="not JSON-safe"):
        ds.state_dict()


def test_resuming_with_another_dataset_warns(pm, data, tmp_path):
    state = make(pm, data).state_dict()
    other = tmp_path / "other.jsonl"
    other.write_text('{"input": "x"}\n')
    with pytest.warns(UserWarning, match="num_prompts=5, but now num_prompts=1"):
        DataSource(RolloutConfig(prompt_data=str(other)), pm=pm).load_state_dict(state)
    with pytest.raises(Exception, match="version"):
        make(pm, data).load_state_dict({**state, "version": 99})


def test_eval_source_overrides_group_size_and_iterates_once(pm, data):
    args = RolloutConfig(prompt_data="unused.jsonl", rollout_shuffle=True, n_samples_per_prompt=8)
    ds = DataSource(args, pm=pm, path=data, n_samples_per_prompt=2, shuffle=False)
    groups = list(ds.iter_groups())
    assert names(groups) == [f"p{i}" for i in range(5)] and len(ds) == 5
    assert [(s.group_index, s.index) for s in groups[4]] == [(4, 8), (4, 9)]
    assert ds.metrics()["groups_served_fresh"] == 0  # iterating does not move the training position
    assert names(ds.get_samples(1)) == ["p0"]


def test_default_plugin_manager_finds_installed_filters(data):
    ds = DataSource(RolloutConfig(prompt_data=str(data), n_samples_per_prompt=1))
    ds.add_samples(ds.get_samples(2))
    assert names(ds.get_samples(1)) == ["p0"]


def test_slime_style_rollout_function_uses_get_and_add(pm, data):
    """A generate_rollout written for slime: it asks for groups and returns a surplus to the buffer."""

    def generate_rollout(args, rollout_id, data_source, evaluation=False):
        groups = data_source.get_samples(args.over_sampling_batch_size)
        data_source.add_samples(groups[args.rollout_batch_size :])
        return groups[: args.rollout_batch_size]

    args = RolloutConfig(
        prompt_data=str(data), rollout_batch_size=2, over_sampling_batch_size=3, n_samples_per_prompt=1
    )
    ds = DataSource(args, pm=pm)
    steps = [names(generate_rollout(args, step, ds)) for step in range(3)]
    assert steps == [["p0", "p1"], ["p2", "p3"], ["p4", "p0"]]
    assert names(ds.buffer) == ["p1"]
