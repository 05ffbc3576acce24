"""Registers the search_r1 generator, the search_r1_em reward and the search tool with rlsdk."""

from rlsdk import CustomGenerate, Reward, hookimpl

from .generator import SEARCH_TOOL, search_r1
from .reward import search_r1_em


@hookimpl
def rlsdk_custom_generates():
    yield CustomGenerate(name="search_r1", func=search_r1)


@hookimpl
def rlsdk_rewards():
    yield Reward(name="search_r1_em", func=search_r1_em)


@hookimpl
def rlsdk_tools():
    yield SEARCH_TOOL
