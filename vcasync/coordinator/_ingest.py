"""One pass over an upload's bytes: decoded and checked while the same chunks are written to storage.

In ``journal`` durability the received wire payload is what the journal keeps (it is checksummed and
self-describing), so the body is split once as it arrives: each chunk goes to the decoder and to a
storage write, no copy made, and the result is accepted when both are done (:func:`tee`). The
journal's record that names those bytes is written later, by the merge loop, only for a result that
passed every check (see :mod:`vcasync.coordinator._journal`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["tee"]

T = TypeVar("T")

#: Chunks held for the slower of the two consumers before the body stops being read.
DEPTH = 16


async def tee(body: AsyncIterable[bytes], write: Callable[[AsyncIterator[bytes]], Awaitable[None]],
              read: Callable[[AsyncIterable[bytes]], Awaitable[T]], *, depth: int = DEPTH) -> T:
    """Hand every chunk of ``body`` to ``read`` and to ``write`` as it arrives; ``read``'s result
    once both are done. Either failing stops the other: ``read``'s error wins (the upload is bad),
    else ``write``'s (the storage is). ``write`` gets exactly the chunks ``read`` was given."""
    queue: asyncio.Queue[bytes | None] = asyncio.Queue(depth)
    ended = False

    async def source() -> AsyncIterator[bytes]:
        nonlocal ended
        async for chunk in body:
            await queue.put(chunk)
            yield chunk
        ended = True
        await queue.put(None)

    async def side() -> AsyncIterator[bytes]:
        while (chunk := await queue.get()) is not None:
            yield chunk

    writer = asyncio.ensure_future(write(side()))
    reader = asyncio.ensure_future(read(source()))
    try:
        await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_EXCEPTION)
        if reader.done() and reader.exception() is None and not writer.done():
            if not ended:        # the reader stopped early: the writer has every chunk it saw
                await queue.put(None)
            await asyncio.wait({writer})
        if reader.done() and reader.exception() is not None:
            raise _error(reader)
        if writer.done() and writer.exception() is not None:
            raise _error(writer)
        return reader.result()
    finally:
        for task in (reader, writer):
            task.cancel()
        await asyncio.wait({reader, writer})
        for task in (reader, writer):
            if not task.cancelled():
                task.exception()      # retrieved: only the error raised above counts
        # The error raised above passes through this frame, and a task holds it: without this,
        # error -> traceback -> this frame -> task -> error is a cycle holding the queued chunks
        # until the cyclic garbage collector runs (a refused upload's last DEPTH chunks).
        del task, reader, writer


def _error(task: asyncio.Future[Any]) -> BaseException:
    exc = task.exception()
    assert exc is not None
    return exc
