"""The file:// store keeps what it writes to its owner: objects 0600, the directories it makes 0700.

Some objects are credentials and the store cannot tell which: a worker's ``identity.json`` under
``--state file://...`` holds its token, the coordinator's ``vcasync/run`` the secret that signs
leases. Created 0o666/0o755 less the umask, any local user of a shared file system read them."""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from backends.local import LocalStorage


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    old = os.umask(0o022)        # the common default, which left objects world-readable
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


async def _chunks() -> AsyncIterator[bytes]:
    yield b"token"
    yield b"-bytes"


async def test_objects_and_made_directories_are_the_owners_only(tmp_path: Path) -> None:
    root = tmp_path / "not" / "yet" / "there"
    store = LocalStorage(root)
    await store.put("workers/w1/identity.json", b'{"token": "t"}')
    await store.put("vcasync/run", b"secret", if_absent=True)
    await store.put_stream("journal/blob", _chunks())
    await store.put("workers/w1/identity.json", b'{"token": "t2"}')      # replaced: still private
    for key in ("workers/w1/identity.json", "vcasync/run", "journal/blob"):
        assert mode(root / key) == 0o600, key
    for made in (root, root / "workers", root / "workers" / "w1", root / "vcasync", tmp_path / "not"):
        assert mode(made) == 0o700, made
    assert await store.get("journal/blob") == b"token-bytes"


async def test_a_root_the_operator_made_keeps_its_mode(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    root.mkdir(mode=0o750)
    os.chmod(root, 0o750)
    await LocalStorage(root).put("a/b", b"x")
    assert mode(root) == 0o750
    assert mode(root / "a") == 0o700
    assert mode(root / "a" / "b") == 0o600
