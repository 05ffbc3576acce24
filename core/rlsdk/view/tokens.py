"""Token ids as text, for the sample page: each id's own piece, read with the run's tokenizer.

The tokenizer is the run's model folder's ``tokenizer.json`` (``hf_checkpoint`` or ``model`` in its saved
settings, or ``rlsdk view --tokenizer``), read with the ``tokenizers`` package (no model, no
transformers). Where there is none, pages show the ids alone and say why.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOKENIZER_FILE = "tokenizer.json"


@dataclass
class TokenText:
    """A tokenizer's pieces, or the reason there is none."""

    tokenizer: Any = None
    source: str | None = None
    missing: str | None = None

    @classmethod
    def load(cls, folder: str | None) -> TokenText:
        """The tokenizer in ``folder`` (a model folder, or a ``tokenizer.json`` itself)."""
        if not folder:
            return cls(missing="the run's settings name no model folder (rlsdk view --tokenizer names one)")
        path = Path(folder).expanduser()
        path = path / TOKENIZER_FILE if path.is_dir() else path
        if not path.is_file():
            return cls(missing=f"no {TOKENIZER_FILE} at {path} (rlsdk view --tokenizer names one)")
        if importlib.util.find_spec("tokenizers") is None:
            return cls(missing="the tokenizers package is not installed (pip install tokenizers)")
        from tokenizers import Tokenizer

        try:
            return cls(tokenizer=Tokenizer.from_file(str(path)), source=str(path))
        except Exception as exc:  # noqa: BLE001 (any damage: the page shows ids and says why)
            return cls(missing=f"{path} cannot be read as a tokenizer ({type(exc).__name__}: {exc})")

    def pieces(self, ids: list[Any]) -> list[str] | None:
        """Each id decoded on its own (a piece of a multi-byte character shows as U+FFFD); None without a
        tokenizer or for ids it does not know."""
        if self.tokenizer is None:
            return None
        try:
            return self.tokenizer.decode_batch([[int(i)] for i in ids], skip_special_tokens=False)
        except Exception:  # noqa: BLE001 (ids of another vocabulary: the page shows the ids)
            return None

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "missing": self.missing}
