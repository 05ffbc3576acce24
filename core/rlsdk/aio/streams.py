"""Async streams: the chunks of a batch's streams, interleaved."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any


async def merge_streams(streams: list[AsyncIterator[dict[str, Any]]]) -> AsyncIterator[dict[str, Any]]:
    """Interleave the streams of a batch, tagging each chunk with its ``index`` in the batch."""
    queue: asyncio.Queue[tuple[int, dict[str, Any] | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[dict[str, Any]]) -> None:
        try:
            async for chunk in stream:
                await queue.put((index, chunk))
            await queue.put((index, None))
        except Exception as exc:
            await queue.put((index, exc))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        open_streams = len(streams)
        while open_streams:
            index, item = await queue.get()
            if item is None:
                open_streams -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield {**item, "index": index}
    finally:
        for task in tasks:
            task.cancel()
