"""Images in chat messages: OpenAI-style ``{"type": "image_url", "image_url": {"url": ...}}`` and
``{"type": "image", "image": ...}`` content parts, each a file path, an http(s) URL or base64 data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..types import Messages

IMAGE_TYPES = ("image", "image_url")


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
    rendered = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            rendered.append(message)
            continue
        parts = []
        for part in content:
            image = image_of(part)
            if image is None:
                parts.append(part)
            else:
                images.append(resolve_image(image, folder))
                parts.append({"type": "image"})
        rendered.append({**message, "content": parts})
    return rendered, images


def text_only(messages: Messages) -> Messages | None:
    """The messages with list contents joined into their text parts (for chat templates of text-only
    models, which take string contents only); None when no content is a list."""
    if not any(isinstance(m.get("content"), list) for m in messages):
        return None
    return [
        {**m, "content": "".join(p.get("text", "") for p in m["content"] if isinstance(p, dict))}
        if isinstance(m.get("content"), list)
        else m
        for m in messages
    ]
