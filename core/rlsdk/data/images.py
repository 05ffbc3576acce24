"""Images in chat messages: OpenAI-style ``{"type": "image_url", "image_url": {"url": ...}}`` and
``{"type": "image", "image": ...}`` content parts, each a file path, an http(s) URL or base64 data."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..types import Messages

IMAGE_TYPES = ("image", "image_url")
PLACEHOLDERS = {"image": "<image>", "video": "<video>", "audio": "<audio>"}
"""slime's media placeholders in a prompt's text, by media type (``multimodal_keys``' keys)."""


def image_of(part: Any) -> str | None:
    """The image a content part holds (path, URL or base64), None for other parts; a malformed image part
    raises ValueError."""
    if not isinstance(part, dict) or part.get("type") not in IMAGE_TYPES:
        return None
    value = part.get(part["type"])
    if isinstance(value, dict):  # {"image_url": {"url": ...}}
        value = value.get("url")
    if not isinstance(value, str) or not value:
        raise ValueError(
            f"a {part['type']!r} content part needs a path, URL or base64 string, got {value!r:.100}"
        )
    return value


def resolve_image(value: str, folder: Path) -> str:
    """A relative path to a file next to the data file becomes absolute; URLs and base64 stay as they are."""
    if value.startswith(("http://", "https://", "data:", "/")):
        return value
    try:
        candidate = folder / value
        return str(candidate.resolve()) if candidate.is_file() else value
    except (OSError, ValueError):  # base64 too long or odd to be a file name
        return value


def split_images(messages: Messages, folder: Path) -> tuple[Messages, list[str]]:
    """The messages with each image part replaced by ``{"type": "image"}`` (what chat templates of
    vision models turn into their image placeholder), and the images in order of appearance."""
    images: list[str] = []

    def placeholders(content: list[Any]) -> list[Any]:
        parts = []
        for part in content:
            image = image_of(part)
            if image is None:
                parts.append(part)
            else:
                images.append(resolve_image(image, folder))
                parts.append({"type": "image"})
        return parts

    return _with_contents(messages, list, placeholders), images


def text_only(messages: Messages) -> Messages | None:
    """The messages with list contents joined into their text parts (for chat templates of text-only
    models, which take string contents only); None when no content is a list."""
    if not any(isinstance(m.get("content"), list) for m in messages):
        return None
    return _with_contents(
        messages, list, lambda content: "".join(p.get("text", "") for p in content if isinstance(p, dict))
    )


def with_media(prompt: str | Messages, row: dict[str, Any], keys: dict[str, str]) -> str | Messages:
    """slime's ``multimodal_keys``: ``prompt`` as chat messages (a string is one user message) whose text has
    each ``<image>`` placeholder replaced by the next of the row's images (``row[keys["image"]]``: paths,
    URLs, base64, content-part dicts, or ``{"bytes", "path"}`` as Hugging Face datasets store images).
    Messages whose content is already a list of parts stay as they are. A count of images that differs
    from the placeholders', or a media type other than images, is a ValueError. A row without the key keeps
    its prompt."""
    unknown = sorted(set(keys) - set(PLACEHOLDERS))
    if unknown:
        raise ValueError(
            f"multimodal_keys: unknown media type(s) {unknown} (slime's: {sorted(PLACEHOLDERS)})"
        )
    media = {kind: row.get(key) for kind, key in keys.items() if row.get(key) is not None}
    if not media:
        return prompt
    others = sorted(set(media) - {"image"})
    if others:
        raise ValueError(f"rlsdk's engines take images only; this row has {others} (multimodal_keys)")
    images = media["image"]
    if not isinstance(images, list):
        images = [images]
    queue = [_image_part(item) for item in images]
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt

    def placed(content: str) -> list[dict[str, Any]]:
        parts: list[dict[str, Any]] = []
        for segment in re.split(f"({re.escape(PLACEHOLDERS['image'])})", content):
            if segment == PLACEHOLDERS["image"]:
                if not queue:
                    raise ValueError(f"more <image> placeholders than the {len(images)} image(s) of the row")
                parts.append(queue.pop(0))
            elif segment:
                parts.append({"type": "text", "text": segment})
        return parts

    with_images = _with_contents(messages, str, placed)
    if queue:
        raise ValueError(f"{len(queue)} more image(s) in the row than <image> placeholders in its prompt")
    return with_images


def _with_contents(messages: Messages, kind: type, rewrite: Callable[[Any], Any]) -> Messages:
    """The messages, each whose content is a ``kind`` (``str`` or ``list``) with ``rewrite(content)`` in its
    place, the others as they are."""
    return [
        {**message, "content": rewrite(message["content"])}
        if isinstance(message.get("content"), kind)
        else message
        for message in messages
    ]


def _image_part(item: Any) -> dict[str, Any]:
    """One row image as a content part."""
    if isinstance(item, dict) and item.get("type") in IMAGE_TYPES:
        return item
    if isinstance(item, dict) and ("bytes" in item or "path" in item):  # a Hugging Face datasets image
        data = item.get("bytes")
        value = base64.b64encode(data).decode() if isinstance(data, (bytes, bytearray)) else item.get("path")
        return {"type": "image", "image": value}
    return {"type": "image", "image": item}
