"""Registers the search_r1 environment, generator, the search_r1_em reward and the search tool with rlsdk."""

from typing import Any

from rlsdk import CustomGenerate, Environment, Option, Reward, hookimpl, package_file

from .generator import SEARCH_TOOL, search_r1
from .reward import search_r1_em


@hookimpl
def rlsdk_custom_generates():
    yield CustomGenerate(name="search_r1", func=search_r1, multi_turn=True)


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


def settings() -> dict[str, Any]:
    """Search-R1 on the shipped questions: the search_r1 generator, exact match, the chat template."""
    return {
        "prompt_data": package_file(__package__, "data/questions.jsonl"),
        "label_key": "label",
        "apply_chat_template": True,
        "custom_generate_function_path": "search_r1",
        "rm_type": "search_r1_em",
        "rollout_max_response_len": 96,
    }


@hookimpl
def rlsdk_environments():
    yield Environment(
        name="search_r1",
        func=settings,
        description="Search-R1 question answering over the shipped corpus (BM25 in process)",
        train_settings={"num_rollout": 8, "rollout_batch_size": 4, "n_samples_per_prompt": 4, "lr": 1e-6},
    )
