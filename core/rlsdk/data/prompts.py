"""Turning data rows into prompts: input, label, metadata and tools keys, chat templates, length filter."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import RolloutConfig
from ..errors import DataError
from ..sizes import MAX_CHARS_PER_TOKEN, json_chars, max_prompt_chars
from ..types import Messages, Sample
from .images import split_images, text_only, with_media
from .rows import BadRowPolicy, Row


@dataclass
class Prompt:
    """One usable prompt: the text sent to the engine (or the chat messages, for rollouts that take
    them), its token ids (empty without a tokenizer), the label and metadata, the images of its
    messages, and the row it came from."""

    prompt: str | Messages
    label: Any
    metadata: dict[str, Any]
    where: str
    tokens: list[int] = field(default_factory=list)
    images: list[str] = field(default_factory=list)

    def sample(self, group_index: int, index: int) -> Sample:
        """A fresh pending Sample; label and metadata are copied so samples never share them."""
        return Sample(
            group_index=group_index,
            index=index,
            prompt=self.prompt,
            tokens=list(self.tokens),
            label=_own_copy(self.label),
            metadata=_own_copy(self.metadata),
            multimodal_inputs={"images": list(self.images)} if self.images else None,
        )


def _own_copy(value: Any) -> Any:
    """A deep copy of ``value``; immutable scalars and empty dicts (the usual label and metadata) skip
    ``copy.deepcopy``'s dispatch, which costs more than the rest of building a sample."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if type(value) is dict and not value:
        return {}
    return copy.deepcopy(value)


class PromptBuilder:
    """Builds prompts from rows following ``args``: ``input_key``, ``label_key``, ``metadata_key``,
    ``tool_key``, ``multimodal_keys``, ``apply_chat_template`` (+ ``apply_chat_template_kwargs``) and
    ``rollout_max_prompt_len``. Prompts are tokenized without adding special tokens (a chat template
    already holds them). Tools found in a row are also kept in ``metadata["tools"]``. Images in the
    messages (relative paths resolved against ``folder``) are kept in ``Prompt.images`` and rendered as
    ``{"type": "image"}`` parts. With ``keep_messages``, chat messages stay messages when no chat
    template is applied (for rollouts that tokenize whole conversations, such as ``sft``)."""

    def __init__(
        self,
        args: RolloutConfig,
        tokenizer: Any,
        bad: BadRowPolicy,
        *,
        folder: Path = Path("."),
        keep_messages: bool = False,
    ) -> None:
        self.args = args
        self.tokenizer = tokenizer
        self.bad = bad
        self.folder = folder
        self.keep_messages = keep_messages
        self.too_long = 0
        if tokenizer is None and args.apply_chat_template:
            raise DataError("apply_chat_template needs a tokenizer: pass the model's tokenizer to DataSource")
        if tokenizer is None and args.rollout_max_prompt_len is not None:
            raise DataError("rollout_max_prompt_len needs a tokenizer to count prompt tokens")
        if (
            args.apply_chat_template
            and getattr(tokenizer, "chat_template", None) is None
            and "chat_template" not in args.apply_chat_template_kwargs
        ):
            raise DataError(
                "apply_chat_template: the tokenizer has no chat template; give one as "
                "apply_chat_template_kwargs: {chat_template: ...}"
            )

    def build(self, rows: Sequence[Row]) -> list[Prompt]:
        prompts = [p for p in (self._from_row(row) for row in rows) if p is not None]
        if self.tokenizer is None or not prompts:
            return prompts
        texts = [p.prompt for p in prompts if isinstance(p.prompt, str)]
        if not texts:
            return prompts
        ids = iter(self.tokenizer(texts, add_special_tokens=False)["input_ids"])
        limit = self.args.rollout_max_prompt_len
        kept = []
        for prompt in prompts:
            if not isinstance(prompt.prompt, str):  # chat messages, kept for a rollout that templates them
                kept.append(prompt)
                continue
            tokens = next(ids)
            if limit is not None and len(tokens) > limit:
                self.too_long += 1
                continue
            prompt.tokens = list(tokens)
            kept.append(prompt)
        return kept

    def _from_row(self, row: Row) -> Prompt | None:
        args, values = self.args, row.values
        raw = values.get(args.input_key)
        if raw is None:
            self.bad.report(row.where, f"no input key {args.input_key!r} (keys: {sorted(values)})")
            return None
        if not (isinstance(raw, str) or _is_messages(raw)):
            self.bad.report(
                row.where,
                f"input {args.input_key!r} must be a string or a list of chat "
                f"messages with a 'role', got {type(raw).__name__}",
            )
            return None
        if args.multimodal_keys:
            try:
                raw = with_media(raw, values, args.multimodal_keys)
            except ValueError as exc:
                self.bad.report(row.where, str(exc))
                return None
        metadata = _json_field(values.get(args.metadata_key), dict)
        tools = _json_field(values.get(args.tool_key), list)
        if metadata is _INVALID or tools is _INVALID:
            key, want = (
                (args.metadata_key, "an object") if metadata is _INVALID else (args.tool_key, "a list")
            )
            self.bad.report(row.where, f"{key!r} must be {want} or its JSON text")
            return None
        metadata = metadata or {}
        if tools is not None:
            metadata.setdefault("tools", tools)
        cap = max_prompt_chars(args.rollout_max_prompt_len or args.rollout_max_context_len)
        size = json_chars([raw, tools], cap)
        if size > cap:  # before any template or tokenizer work (D1)
            self.bad.report(
                row.where,
                f"the prompt has more than {cap:,} characters ({_limit_source(args)}), so more tokens "
                "than it allows: not templated or tokenized",
            )
            return None
        label = values.get(args.label_key) if args.label_key else None
        images: list[str] = []
        messages = raw
        if isinstance(raw, list):
            try:
                messages, images = split_images(raw, self.folder)
            except ValueError as exc:
                self.bad.report(row.where, str(exc))
                return None
        prompt: str | Messages | None
        if args.apply_chat_template:
            prompt = self._render(messages, tools, row)
            if prompt is None:
                return None
        elif isinstance(raw, list) and not self.keep_messages:
            raise DataError(
                f"{row.where}: the prompt is a list of chat messages; pass --apply-chat-template "
                f"to render it with the tokenizer's chat template"
            )
        else:
            prompt = raw
        return Prompt(prompt=prompt, label=label, metadata=metadata, where=row.where, images=images)

    def _render(self, raw: str | Messages, tools: list[Any] | None, row: Row) -> str | None:
        """The chat template's text; content parts go to the template as they are, and as their joined
        text where it takes string contents only (a text-only model's; the images stay with the sample)."""
        messages = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
        try:
            return self._apply_template(messages, tools)
        except Exception as exc:  # noqa: BLE001 -- a template rejecting a row's messages is a bad row
            flat = text_only(messages)
            if flat is not None:
                try:
                    return self._apply_template(flat, tools)
                except Exception:  # noqa: BLE001 -- report the first failure
                    pass
            self.bad.report(row.where, f"the chat template failed: {type(exc).__name__}: {exc}")
            return None

    def _apply_template(self, messages: Messages, tools: list[Any] | None) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=True,
            tokenize=False,
            **self.args.apply_chat_template_kwargs,
        )


_INVALID = object()


def _limit_source(args: RolloutConfig) -> str:
    if args.rollout_max_prompt_len:
        return (
            f"rollout_max_prompt_len {args.rollout_max_prompt_len} x {MAX_CHARS_PER_TOKEN} characters a token"
        )
    if args.rollout_max_context_len:
        return f"rollout_max_context_len {args.rollout_max_context_len} x {MAX_CHARS_PER_TOKEN} characters a token"
    return "the default limit without rollout_max_prompt_len"


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value)


def _json_field(value: Any, kind: type) -> Any:
    """``value`` if it is None or ``kind``, its JSON decoding if that gives ``kind``, else ``_INVALID``."""
    if value is None or isinstance(value, kind):
        return value
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError:
            return _INVALID
        return decoded if isinstance(decoded, kind) else _INVALID
    return _INVALID
