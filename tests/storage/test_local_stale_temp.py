"""``LocalStorage.remove_stale_temp`` (which a coordinator calls at start and every 10 minutes)
deletes the temporary files of writers killed mid-write, never a live write's, and nothing that is
not one of its own temporary files."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backends import local
from backends.local import TMP_DIR, LocalStorage
from vcasync.errors import StorageError


async def test_a_trickling_streamed_write_keeps_its_temporary_file_fresh(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An upload trickling in small chunks (well under the 1 MiB gathered before a write) wrote
    # nothing, so its file kept the mtime of its creation: the sweep deleted it mid-write, and the
    # write then failed ('its directory kept disappearing'), which a coordinator takes for a
    # storage outage. Scaled down: a touch every 0.2 s, files untouched for 3 s are stale
    # (a chunk every 0.5 s for 5 s: the old code left the file at its creation mtime).
    monkeypatch.setattr(local, "TOUCH_EVERY_S", 0.2, raising=False)
    store = LocalStorage(tmp_path)
    done = asyncio.Event()

    async def trickle() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 4096
            await asyncio.sleep(0.5)

    async def sweep() -> int:
        removed = 0
        while not done.is_set():
            removed += await store.remove_stale_temp(3.0)
            await asyncio.sleep(0.1)
        return removed

    sweeper = asyncio.ensure_future(sweep())
    try:
        await store.put_stream("incoming/blob", trickle(), if_absent=True)
    finally:
        done.set()
        removed = await sweeper
    assert removed == 0
    assert await store.get("incoming/blob") == b"x" * 4096 * 10


async def test_the_sweep_removes_only_its_own_stale_files_and_is_not_stopped_by_others(
        tmp_path: Path) -> None:
    tmp = tmp_path / TMP_DIR
    tmp.mkdir()
    outside = tmp_path / "precious.bin"
    outside.write_bytes(b"keep")
    old = time.time() - 7200

    def aged(path: Path) -> Path:
        os.utime(path, (old, old), follow_symlinks=False)
        return path

    (tmp / "a-dir.tmp").mkdir()                   # a directory: used to end the sweep (EISDIR)
    aged(tmp / "a-dir.tmp")
    link = tmp / "b-link.tmp"
    link.symlink_to(outside)
    aged(link)
    notes = tmp / "c-notes.txt"                   # not a temporary file of this backend
    notes.write_bytes(b"operator's")
    aged(notes)
    stale = tmp / "d0123456789abcdef.tmp"
    stale.write_bytes(b"\0" * 4096)
    aged(stale)
    fresh = tmp / "e0123456789abcdef.tmp"
    fresh.write_bytes(b"\0")

    assert await LocalStorage(tmp_path).remove_stale_temp(600) == 1
    assert not stale.exists()
    assert fresh.exists()
    assert notes.exists()
    assert (tmp / "a-dir.tmp").is_dir()
    assert link.is_symlink()
    assert outside.read_bytes() == b"keep"


async def test_a_write_whose_temporary_file_was_swept_says_so(tmp_path: Path) -> None:
    # A writer stopped past the stale age (a coordinator SIGSTOPped, then taken over) finds its
    # file gone at publish: that used to read 'its directory kept disappearing'.
    store = LocalStorage(tmp_path)

    async def chunks() -> AsyncIterator[bytes]:
        yield b"x" * 4096
        for entry in os.scandir(tmp_path / TMP_DIR):
            os.unlink(entry.path)              # what a sweep by another coordinator does
        yield b"y" * 4096

    with pytest.raises(StorageError, match=r"temporary file .* was deleted before it was published"):
        await store.put_stream("incoming/blob", chunks(), if_absent=True)
    assert not await store.exists("incoming/blob")


async def test_ages_are_taken_on_the_file_systems_clock_not_this_machines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # On a network file system the server stamps files with its clock: on a client whose clock ran
    # 9 minutes ahead, a live write's file (stamped just now by the server) looked 9 minutes old,
    # and a sweep of files untouched for 5 minutes deleted it mid-write.
    tmp = tmp_path / TMP_DIR
    tmp.mkdir()
    live = tmp / "f0123456789abcdef.tmp"
    live.write_bytes(b"\0")                        # stamped now by the file system's clock
    stale = tmp / "00123456789abcdef.tmp"
    stale.write_bytes(b"\0")
    old = time.time() - 400
    os.utime(stale, (old, old))                    # untouched for 400 s on the file system's clock
    ahead = time.time
    monkeypatch.setattr(time, "time", lambda: ahead() + 540.0)     # this machine: 9 minutes ahead

    assert await LocalStorage(tmp_path).remove_stale_temp(300) == 1
    assert live.exists()
    assert not stale.exists()
