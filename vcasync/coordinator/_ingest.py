"""One pass over an upload's bytes: decoded and checked while the same chunks are written to storage.

In ``journal`` durability the received wire payload is what the journal keeps (it is checksummed and
self-describing), so the body is split once as it arrives: each chunk goes to the decoder and to a
storage write, no copy made (:func:`tee`). The decoded result is handed on as soon as the decoder is
done, with the write still finishing (its last chunks and the storage's fsync): the merge loop
merges it into the private working model meanwhile, and publishes the new version, and
acknowledges it, only once the bytes are on storage and the journal's record that names them is
written (see :mod:`vcasync.coordinator._merger`). A result that fails any check is never
journaled, and its bytes are deleted.
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
              read: Callable[[AsyncIterable[bytes]], Awaitable[T]], *,
              depth: int = DEPTH) -> tuple[T, asyncio.Future[None]]:
    """Hand every chunk of ``body`` to ``read`` and to ``write`` as it arrives. Returns once
    ``read`` is done: its result, and the write, still finishing, as a future the caller owns
    (await it, or cancel it). ``write`` gets exactly the chunks ``read`` was given.

    Either failing before ``read`` is done stops the other and raises: ``read``'s error wins (the
    upload is bad), else ``write``'s (the storage is). A write that fails later fails the future."""
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
    handed_over = False
    try:
        while not reader.done():        # a write done first has every chunk: wait for the reader
            await asyncio.wait([t for t in (reader, writer) if not t.done()],
                               return_when=asyncio.FIRST_COMPLETED)
            if writer.done() and writer.exception() is not None:
                break
        if reader.done() and reader.exception() is not None:
            raise _error(reader)
        if writer.done() and writer.exception() is not None:
            raise _error(writer)
        written = asyncio.ensure_future(_finish(writer, queue, ended))
        handed_over = True
        return reader.result(), written
    finally:
        tasks = (reader,) if handed_over else (reader, writer)
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
        for task in tasks:
            if not task.cancelled():
                task.exception()      # retrieved: only the error raised above counts
        # The error raised above passes through this frame, and a task holds it: without this,
        # error -> traceback -> this frame -> task -> error is a cycle holding the queued chunks
        # until the cyclic garbage collector runs (a refused upload's last DEPTH chunks).
        del task, tasks, reader, writer


async def _finish(writer: asyncio.Future[None], queue: asyncio.Queue[bytes | None], ended: bool) -> None:
    """The write to its end: told where the chunks end if the reader stopped before the body did
    (it has every chunk the reader saw). Cancelled, it cancels the write and waits for it."""
    try:
        if not ended:
            end = asyncio.ensure_future(queue.put(None))   # a full queue: the writer makes room
            try:
                await asyncio.wait({end, writer}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                end.cancel()
        await asyncio.shield(writer)
    except asyncio.CancelledError:
        writer.cancel()
        await asyncio.wait({writer})
        if not writer.cancelled():
            writer.exception()
        raise


def _error(task: asyncio.Future[Any]) -> BaseException:
    exc = task.exception()
    assert exc is not None
    return exc
