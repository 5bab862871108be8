"""A caller cancelled while a file is being opened in a thread leaves nothing open: a worker
stopped mid-upload leaked its spooled result file (a ResourceWarning turned a served test red)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import warnings
from pathlib import Path

from vcasync._aio import close_file, open_binary


async def test_a_cancel_during_the_open_closes_what_the_thread_opened(tmp_path: Path) -> None:
    path = tmp_path / "result.vca"
    path.write_bytes(b"x" * 10)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        for _ in range(20):
            task = asyncio.ensure_future(open_binary(path))
            await asyncio.sleep(0)             # the open is in its thread
            task.cancel()
            try:
                f = await task
            except asyncio.CancelledError:
                continue
            f.close()                          # the open won the race: the caller owns the file
        await asyncio.sleep(0.2)               # every thread done, its callback run
        gc.collect()
    assert not [w for w in seen if issubclass(w.category, ResourceWarning)]


async def test_an_open_that_was_not_cancelled_returns_the_file(tmp_path: Path) -> None:
    path = tmp_path / "result.vca"
    path.write_bytes(b"abc")
    f = await open_binary(path)
    with f:
        assert f.read() == b"abc"


async def test_a_cancel_during_the_close_still_closes(tmp_path: Path) -> None:
    for _ in range(20):
        f = (tmp_path / "part").open("wb")
        f.write(b"data")
        task = asyncio.ensure_future(close_file(f))
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for _ in range(100):                   # the close runs on in its thread
            if f.closed:
                break
            await asyncio.sleep(0.01)
        assert f.closed
        assert (tmp_path / "part").read_bytes() == b"data"   # flushed
