"""The hook implementations that register the generators package's plugins."""

from rlsdk import CustomGenerate, hookimpl

from . import single_turn


@hookimpl
def rlsdk_custom_generates():
    yield CustomGenerate(name="single_turn", func=single_turn.single_turn)
