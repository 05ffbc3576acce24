"""Retrieval for Search-R1: the local BM25 index in process, or any server with Search-R1's
``/retrieve`` shape (``{"queries", "topk", "return_scores"}`` -> ``{"result": [[{"document", "score"}]]}``)."""

from __future__ import annotations

from typing import Any

from . import CORPUS
from .bm25 import load_index


def options(args: Any) -> tuple[str | None, str, int]:
    """(retriever URL or None for in process, corpus path, top k) from the run's options."""
    return (
        getattr(args, "search_r1_retriever_url", None),
        str(getattr(args, "search_r1_corpus", None) or CORPUS),
        int(getattr(args, "search_r1_topk", 3)),
    )


def title_and_text(doc: dict[str, Any]) -> tuple[str, str]:
    """Search-R1 passages hold ``"Title"\\ntext`` in ``contents``."""
    first, _, rest = doc.get("contents", "").partition("\n")
    return first.strip().strip('"'), rest.strip()


def format_passages(docs: list[dict[str, Any]]) -> str:
    """``Doc i(Title: ...) text`` lines, as Search-R1 shows retrieved passages to the model."""
    lines = []
    for i, doc in enumerate(docs, 1):
        title, text = title_and_text(doc)
        lines.append(f"Doc {i}(Title: {title}) {text}")
    return "\n".join(lines)


async def retrieve(args: Any, query: str) -> list[dict[str, Any]]:
    """The top passages for ``query`` from the configured retriever."""
    url, corpus, topk = options(args)
    if not url:
        return [doc for doc, _ in load_index(corpus).search(query, topk)]
    import httpx

    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(
            url.rstrip("/") + "/retrieve", json={"queries": [query], "topk": topk, "return_scores": True}
        )
        response.raise_for_status()
        hits = response.json()["result"][0]
    return [hit["document"] if isinstance(hit, dict) and "document" in hit else hit for hit in hits]


async def search(args: Any, query: str) -> str:
    """Search the corpus; the retrieved passages, one ``Doc i(Title: ...)`` line each."""
    return format_passages(await retrieve(args, query))
