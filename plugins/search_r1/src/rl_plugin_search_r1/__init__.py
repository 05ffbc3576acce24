"""rl-plugin-search-r1: Search-R1 style search-augmented question answering for rlsdk."""

from pathlib import Path

DATA = Path(__file__).parent / "data"
CORPUS = DATA / "corpus.jsonl"
"""The small corpus shipped with the package (one ``{"id", "contents"}`` passage per line)."""
QUESTIONS = DATA / "questions.jsonl"
"""Questions answerable from :data:`CORPUS`, as rlsdk data rows (``input``, ``label``)."""
