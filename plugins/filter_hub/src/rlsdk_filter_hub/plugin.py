"""The hook implementations that register filter_hub's filters."""

from rlsdk import BufferFilter, DynamicFilter, hookimpl

from . import buffer, dynamic


@hookimpl
def rlsdk_dynamic_filters():
    yield DynamicFilter(name="check_reward_nonzero_std", func=dynamic.check_reward_nonzero_std)


@hookimpl
def rlsdk_buffer_filters():
    yield BufferFilter(name="pop_first", func=buffer.pop_first)
