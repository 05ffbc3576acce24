"""Exact resume, property-based: for random sequences of get, add (return groups to the buffer) and save,
a source restored from any saved state serves exactly the groups the uninterrupted run served after that
point, and the uninterrupted run skips no prompt and repeats none within an epoch."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rlsdk import RolloutConfig, get_plugin_manager
from rlsdk.data import START_ROLLOUT_ID, DataSource

try:
    import rlsdk_filter_hub.plugin as filter_hub
except ImportError:  # core alone: its own buffer filter only
    filter_hub = None

SIZES = (1, 2, 5)
BUFFER_FILTERS = ["pop_first", *(["pop_last", "drop_stale"] if filter_hub else [])]

ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("get"), st.integers(0, 4)),
        st.tuples(st.just("add"), st.lists(st.booleans(), min_size=1, max_size=4)),
        st.tuples(st.just("save")),
    ),
    max_size=30,
)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    folder = tmp_path_factory.mktemp("resume")
    paths = {}
    for size in SIZES:
        paths[size] = folder / f"d{size}.jsonl"
        paths[size].write_text(
            "".join(json.dumps({"input": f"p{i}", "metadata": {"row": i}}) + "\n" for i in range(size))
        )
    return paths


@pytest.fixture(scope="module")
def pm():
    return get_plugin_manager(load_entrypoints=False, plugins=[filter_hub] if filter_hub else [])


def snapshot(groups):
    return json.loads(json.dumps([[s.to_dict() for s in g] for g in groups]))


def run(ds, ops, step=0):
    """Apply ``ops``; returns the groups served by each get, the states saved (with the op position,
    the gets before it and the step) and the number of groups added."""
    served, saves, added, last = [], [], 0, []
    for position, op in enumerate(ops):
        if op[0] == "get":
            step += 1
            last = ds.get_samples(op[1], rollout_id=step)
            served.append(snapshot(last))
        elif op[0] == "add":
            chosen = [g for g, keep in zip(last, op[1]) if keep]
            last = [g for g, keep in zip(last, op[1]) if not keep]
            for group in chosen:  # as a partial rollout would: some tokens and a reward
                for sample in group:
                    sample.response += "x"
                    sample.append_response_tokens([7], [-0.5])
                    sample.reward = {"score": 1.0, "acc": True} if len(sample.response) % 2 else -0.5
            ds.add_samples(chosen)
            added += len(chosen)
        else:  # a checkpoint between steps: what the loop held is in the buffer or done
            saves.append((position, len(served), step, json.loads(json.dumps(ds.state_dict()))))
            last = []
    return served, saves, added


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=ops_strategy,
    size=st.sampled_from(SIZES),
    n=st.integers(1, 3),
    shuffle=st.booleans(),
    buffer_filter=st.sampled_from(BUFFER_FILTERS),
    staleness=st.integers(0, 3),
)
def test_resume_serves_exactly_what_an_uninterrupted_run_serves(
    datasets, pm, ops, size, n, shuffle, buffer_filter, staleness
):
    args = RolloutConfig(
        prompt_data=str(datasets[size]),
        n_samples_per_prompt=n,
        rollout_shuffle=shuffle,
        rollout_seed=7,
        buffer_filter_path=buffer_filter,
        extra={"buffer_max_staleness": staleness},  # drop_stale's option (rlsdk-filter-hub)
    )
    reference = DataSource(args, pm=pm)
    served, saves, added = run(reference, ops)

    for position, gets_before, step, state in saves:
        resumed = DataSource(args, pm=pm)
        resumed.load_state_dict(state)
        replay, _, _ = run(resumed, ops[position + 1 :], step)
        assert replay == served[gets_before:]
        assert resumed.metrics() == reference.metrics()

    # no prompt skipped or repeated: fresh groups are numbered in order and each epoch covers every prompt
    fresh = [g for groups in served for g in groups if START_ROLLOUT_ID not in g[0]["metadata"]]
    assert [g[0]["group_index"] for g in fresh] == list(range(len(fresh)))
    rows = [g[0]["metadata"]["row"] for g in fresh]
    for start in range(0, len(rows), size):
        epoch = rows[start : start + size]
        assert len(set(epoch)) == len(epoch)
        assert shuffle or epoch == list(range(len(epoch)))
    for g in fresh:
        assert [s["index"] for s in g] == [g[0]["group_index"] * n + i for i in range(n)]

    # every group returned to the buffer is served again, still buffered, or dropped as stale
    metrics = reference.metrics()
    assert (
        metrics["groups_served_from_buffer"] + metrics["buffer_size"] + metrics["buffer_groups_dropped"]
        == added
    )
    assert buffer_filter == "drop_stale" or metrics["buffer_groups_dropped"] == 0
    assert metrics["groups_served_fresh"] == len(fresh)
