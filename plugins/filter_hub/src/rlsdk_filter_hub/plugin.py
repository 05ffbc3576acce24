"""The hook implementations that register filter_hub's filters (light imports only)."""

from rlsdk import BufferFilter, DynamicFilter, Option, OverSamplingFilter, hookimpl

from . import buffer, dynamic, over_sampling


@hookimpl
def rlsdk_dynamic_filters():
    yield DynamicFilter(name="check_reward_nonzero_std", func=dynamic.check_reward_nonzero_std)
    yield DynamicFilter(
        name="check_reward_nonzero_std_with_fallback", func=dynamic.check_reward_nonzero_std_with_fallback
    )
    yield DynamicFilter(name="check_metric_nonzero_std", func=dynamic.check_metric_nonzero_std)
    yield DynamicFilter(name="reward_range", func=dynamic.reward_range)


@hookimpl
def rlsdk_over_sampling_filters():
    yield OverSamplingFilter(name="sort_by_reward_std", func=over_sampling.sort_by_reward_std)
    yield OverSamplingFilter(name="prefer_fewer_invalid", func=over_sampling.prefer_fewer_invalid)


@hookimpl
def rlsdk_buffer_filters():
    yield BufferFilter(name="pop_last", func=buffer.pop_last)
    yield BufferFilter(name="drop_stale", func=buffer.drop_stale)


@hookimpl
def rlsdk_options():
    yield Option(
        "buffer_max_staleness",
        int,
        help="For the drop_stale buffer filter: drop (and count) buffered "
        "groups whose generation started more than this many steps before the current one; none keeps "
        "every group.",
    )
    yield Option(
        "dynamic_filter_metric_key",
        str,
        "acc",
        help="For the check_metric_nonzero_std dynamic filter: "
        "the dict-reward key it reads (e.g. DAPO's acc) instead of the shaped reward of reward_key.",
    )
    yield Option(
        "reward_range_min",
        float,
        0.0,
        help="For the reward_range dynamic filter: groups need a mean reward strictly above this.",
    )
    yield Option(
        "reward_range_max",
        float,
        1.0,
        help="For the reward_range dynamic filter: groups need a mean reward strictly below this.",
    )
