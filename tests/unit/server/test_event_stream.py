"""event_stream: queued outputs join one write, and an output the view sends nothing for (text held back) never
makes a ready event wait for an output that has not arrived."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest

from infer.server.generation import event_stream


def _view(queue: asyncio.Queue[str | None]) -> AsyncIterator[str]:
    async def chunks() -> AsyncIterator[str]:
        while True:
            item = await queue.get()
            yield "" if item is None else item  # None: an output held back, as a stop-string prefix is

    return chunks()


def test_a_ready_event_is_written_when_the_rest_of_the_queue_is_held_back() -> None:
    async def main() -> None:
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        for item in ("a", None, None):
            queue.put_nowait(item)
        body = event_stream(_view(queue), SimpleNamespace(has_queued=lambda: not queue.empty())).body_iterator
        assert await asyncio.wait_for(anext(body), 1.0) == "a"
        for item in ("b", "c", None):
            queue.put_nowait(item)
        assert await asyncio.wait_for(anext(body), 1.0) == "bc"  # one write for what was queued
        queue.put_nowait(None)
        queue.put_nowait("d")
        assert await asyncio.wait_for(anext(body), 1.0) == "d"
        queue.put_nowait(None)  # nothing to send: no empty write, the stream waits for the next output
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(anext(body), 0.2)

    asyncio.run(main())
