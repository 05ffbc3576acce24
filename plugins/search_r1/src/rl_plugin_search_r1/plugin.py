"""Registers the search_r1 generator, the search_r1_em reward and the search tool with rlsdk."""

from rlsdk import CustomGenerate, Option, Reward, hookimpl

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


@hookimpl
def rlsdk_options():
    yield Option(
        "search_r1_retriever_url",
        str,
        help="URL of a retrieval server; none searches the BM25 corpus in process.",
    )
    yield Option(
        "search_r1_corpus",
        str,
        help="JSONL corpus of the in-process BM25 retriever; default the shipped one.",
    )
    yield Option("search_r1_topk", int, 3, help="Passages per search.")
    yield Option("search_r1_format_score", float, 0.0, help="Reward of a well-formed answer that is wrong.")
