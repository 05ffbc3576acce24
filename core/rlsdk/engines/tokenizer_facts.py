"""What the two sides of a run (the engine that samples, the trainer that learns) must agree on about the
tokenizer: its size, its special tokens and its chat template, as each side reports them."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def tokenizer_fingerprint(tokenizer: Any) -> dict[str, Any]:
    """A Hugging Face tokenizer's vocabulary size (``len``: with the added tokens), end and start token ids,
    and the SHA-256 (first 12 hex digits) of its chat template (None: it has none or does not say)."""
    template = getattr(tokenizer, "chat_template", None)
    if template is not None and not isinstance(template, str):  # several named templates
        template = json.dumps(template, sort_keys=True)
    size: int | None
    try:
        size = len(tokenizer)
    except TypeError:  # not a Hugging Face tokenizer (a test's byte tokenizer)
        size = getattr(tokenizer, "vocab_size", None)
    return {
        "vocab_size": size,
        "eos_token_id": getattr(tokenizer, "eos_token_id", None),
        "bos_token_id": getattr(tokenizer, "bos_token_id", None),
        "chat_template": None if template is None else hashlib.sha256(template.encode()).hexdigest()[:12],
    }
