"""Small asyncio helpers shared by the rooms that run tasks in parallel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

__all__ = ["buffer_blocks", "close_file", "file_blocks", "first_error", "open_binary", "run_all",
           "to_thread_released"]

T = TypeVar("T")


async def to_thread_released(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """:func:`asyncio.to_thread` that lets go of ``fn`` and its arguments as soon as ``fn``
    returns. The executor's work item holds them until its thread gets round to dropping it,
    which can be after the caller has resumed: a caller that then judges buffers unshared by
    their reference counts (:class:`~vcasync.coordinator._buffers.BufferPool`) would find them held."""
    box: list[Any] = [fn, args, kwargs]

    def call() -> T:
        f, a, k = box
        box.clear()
        return f(*a, **k)   # type: ignore[no-any-return]

    return await asyncio.to_thread(call)


async def buffer_blocks(view: memoryview, block: int) -> AsyncIterator[memoryview]:
    """``view`` in slices of ``block`` bytes, none copied: an HTTP body that aiohttp writes a
    piece at a time, awaiting the socket between them, instead of copying one huge buffer."""
    for start in range(0, view.nbytes, block):
        yield view[start:start + block]


async def open_binary(path: Path, mode: str = "rb") -> BinaryIO:
    """``path`` opened (``"rb"`` or ``"wb"``) in a thread. A caller cancelled while the thread opens
    it used to leave the file open (the thread finishes the open after the await has gone: a worker
    stopped mid-upload leaked its result file, a ResourceWarning); now whatever the thread opens
    after the caller has gone is closed. Pair it with :func:`close_file`."""
    if mode not in ("rb", "wb"):
        raise ValueError(f"mode must be 'rb' or 'wb', got {mode!r}")
    opening: asyncio.Future[BinaryIO] = asyncio.ensure_future(
        asyncio.to_thread(path.open, mode))  # type: ignore[arg-type]
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_close_opened)
        raise


async def close_file(f: BinaryIO) -> None:
    """``f.close()`` in a thread (a write's close flushes), done even when the caller is cancelled
    meanwhile: a cancelled ``to_thread`` whose job had not started yet never ran, and the file stayed
    open."""
    await asyncio.shield(asyncio.ensure_future(asyncio.to_thread(f.close)))


def _close_opened(opening: asyncio.Future[BinaryIO]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()


async def file_blocks(f: BinaryIO, block: int) -> AsyncIterator[bytes]:
    """An open file, ``block`` bytes per thread hop, to its end."""
    while data := await asyncio.to_thread(f.read, block):
        yield data


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The innermost first failure of a TaskGroup's exception group (callers catch our error
    classes, not groups)."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def run_all(jobs: Iterable[Awaitable[None]]) -> None:
    """Run ``jobs`` concurrently; raise the first failure once all have ended.

    Not a TaskGroup on purpose: on Python 3.11 a TaskGroup whose parent is cancelled while a child
    fails raises the child's error *instead of* the cancellation (fixed in 3.12), so a caller that
    handles storage errors would swallow the cancel and run on forever. ``gather`` propagates it.
    """
    results = await asyncio.gather(*jobs, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
