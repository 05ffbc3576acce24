"""Model names, as Tinker recipes give them, and the local folders they stand for.

A recipe names its base model (``base_model="Qwen/Qwen3-8B"``); the server maps each name it serves to a
local Hugging Face folder (``--model NAME=PATH``; no ``--model``: the engine's default model, SmolLM2-135M-
Instruct, as :data:`DEFAULT_NAME`). The model hub is never asked. A recipe that loads its tokenizer by the
same name (``AutoTokenizer.from_pretrained(name)``) finds it offline in a folder of that name under its
working directory (a link to the model folder): transformers reads a local folder before the hub, and
``datasets.load_dataset(name)`` does the same with a data folder (docs/tinker.md)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""What the engine's default model is served as when no ``--model`` is given."""


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
