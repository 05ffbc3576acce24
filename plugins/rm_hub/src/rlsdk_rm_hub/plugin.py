"""The hook implementations that register rm_hub's rewards."""

from rlsdk import Reward, hookimpl

from . import f1


@hookimpl
def rlsdk_rewards():
    yield Reward(name="f1", func=f1.f1, description="SQuAD token F1 between response and label")
