"""The ``search_r1`` generator: reason, ``<search>`` the corpus, read ``<information>``, ``<answer>``."""

from __future__ import annotations

import re
from typing import Any

from rlsdk import Sample, Tool, append_observation, call_tool, model_turn

from .retriever import search

SEARCH = re.compile(r"<search>(.*?)</search>", re.DOTALL)
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
SEARCH_TOOL = Tool(name="search", func=search, description="Search the Search-R1 corpus", timeout=30.0)


async def search_r1(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Turns of reasoning and ``<search>query</search>`` until ``<answer>``: retrieved passages are
    appended as ``<information>...</information>`` with loss mask 0. Resumes after an abort."""
    state = sample.metadata.setdefault("search_r1", {"turns": 0, "searches": 0, "partial_turn": ""})
    while state["turns"] < args.max_turns:
        state["partial_turn"] += await model_turn(
            args, sample, sampling_params, stop=["</search>", "</answer>"]
        )
        if sample.status == Sample.Status.ABORTED:
            return sample
        text, state["partial_turn"] = state["partial_turn"], ""
        state["turns"] += 1
        if sample.status != Sample.Status.COMPLETED or ANSWER.search(text):
            return sample
        queries = SEARCH.findall(text)
        if not queries:
            return sample  # neither a search nor an answer: the reward judges it
        result = await call_tool(SEARCH_TOOL, args, {"query": queries[-1].strip()})
        state["searches"] += 1
        if result.error:
            state.setdefault("errors", []).append(result.error)
        if not append_observation(
            args, sample, f"\n\n<information>{result.text}</information>\n\n", sampling_params
        ):
            return sample
    sample.status = Sample.Status.TRUNCATED
    return sample
