"""Model names, as Tinker recipes give them, and the local folders they stand for.

A recipe names its base model (``base_model="Qwen/Qwen3-8B"``); the server maps each name it serves to a
local Hugging Face folder (``--model NAME=PATH``; no ``--model``: the engine's default model, SmolLM2-135M-
Instruct, as :data:`DEFAULT_NAME`). The model hub is never asked. A recipe that loads its tokenizer by the
same name (``AutoTokenizer.from_pretrained(name)``) finds it offline once the folder's tokenizer is linked
into the Hugging Face cache under that name (:func:`link_tokenizer`, ``rlsdk tinker link-tokenizer``, with
``HF_HUB_OFFLINE=1``)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

DEFAULT_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""What the engine's default model is served as when no ``--model`` is given."""
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
)
SNAPSHOT = "local"
"""The revision name linked folders get in the cache (``refs/main`` points to it)."""


def parse_models(specs: list[str]) -> dict[str, Path | None]:
    """``NAME=PATH`` specs as ``{name: folder}``; none given: ``{DEFAULT_NAME: None}`` (the engine's default)."""
    if not specs:
        return {DEFAULT_NAME: None}
    models: dict[str, Path | None] = {}
    for spec in specs:
        name, sep, folder = spec.partition("=")
        if not sep or not name.strip() or not folder.strip():
            raise ValueError(f"--model {spec!r}: NAME=PATH (the name recipes use, a local model folder)")
        path = Path(folder.strip()).expanduser().resolve()
        if not (path / "config.json").is_file():
            raise ValueError(f"--model {spec!r}: {path} is not a Hugging Face model folder (no config.json)")
        if name.strip() in models:
            raise ValueError(f"--model: {name.strip()!r} is given twice")
        models[name.strip()] = path
    return models


def hub_cache() -> Path:
    """The Hugging Face hub cache: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".cache" / "huggingface") / "hub"


def link_tokenizer(name: str, folder: Path, cache: Path | None = None) -> Path:
    """Copy ``folder``'s tokenizer (and config) files into the hub cache as the model ``name`` (``org/model``),
    so that ``AutoTokenizer.from_pretrained(name)`` loads them offline; returns the snapshot folder."""
    if not _REPO.match(name):
        raise ValueError(f"{name!r}: a model name of the form org/model")
    files = [folder / f for f in TOKENIZER_FILES if (folder / f).is_file()]
    if not any(f.name.startswith("tokenizer") for f in files):
        raise ValueError(f"{folder} holds no tokenizer files")
    repo = (cache or hub_cache()) / f"models--{name.replace('/', '--')}"
    snapshot = repo / "snapshots" / SNAPSHOT
    snapshot.mkdir(parents=True, exist_ok=True)
    for file in files:
        shutil.copyfile(file, snapshot / file.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(SNAPSHOT)
    return snapshot
