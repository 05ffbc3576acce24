"""A BM25 index over a JSONL corpus of ``{"id", "contents"}`` passages (Search-R1's corpus format)."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

_WORD = re.compile(r"\w+")
_STOPWORDS = frozenset(
    "a an and are as at be by did do does for from has have how in is it its of on or the to was were "
    "what when where which who whom why with".split()
)


def terms(text: str) -> list[str]:
    """Lower-cased word terms without common stop words."""
    return [w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS]


class BM25Index:
    """Okapi BM25 (``k1``, ``b``) over passages held in memory."""

    def __init__(self, docs: list[dict[str, Any]], k1: float = 1.2, b: float = 0.75) -> None:
        self.docs = docs
        self.k1, self.b = k1, b
        self.doc_terms = [Counter(terms(d["contents"])) for d in docs]
        self.lengths = [sum(c.values()) for c in self.doc_terms]
        self.avg_length = sum(self.lengths) / max(len(docs), 1)
        df = Counter(t for c in self.doc_terms for t in c)
        n = len(docs)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    @classmethod
    def from_jsonl(cls, path: str | Path) -> BM25Index:
        docs = []
        with open(path, encoding="utf-8") as lines:
            for line_no, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{line_no}: not JSON: {exc}") from None
                if not isinstance(doc, dict) or not isinstance(doc.get("contents"), str):
                    raise ValueError(f'{path}:{line_no}: a passage needs a "contents" string')
                doc.setdefault("id", str(line_no - 1))
                docs.append(doc)
        return cls(docs)

    def score(self, query_terms: list[str], i: int) -> float:
        counts, norm = self.doc_terms[i], self.k1 * (1 - self.b + self.b * self.lengths[i] / self.avg_length)
        return sum(
            self.idf[t] * counts[t] * (self.k1 + 1) / (counts[t] + norm) for t in query_terms if t in counts
        )

    def search(self, query: str, topk: int = 3) -> list[tuple[dict[str, Any], float]]:
        """The ``topk`` best passages with their scores, best first (ties by corpus order)."""
        query_terms = terms(query)
        scored = [(self.score(query_terms, i), -i) for i in range(len(self.docs))]
        best = sorted(scored, reverse=True)[:topk]
        return [(self.docs[-neg_i], s) for s, neg_i in best]


@lru_cache(maxsize=4)
def load_index(path: str) -> BM25Index:
    """The index of a corpus file, built once per process."""
    return BM25Index.from_jsonl(path)
