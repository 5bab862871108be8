"""The owner lease's takeover rules that need no waiting: a holder is taken over at once only when it
is provably dead (released; long stale by the wall clock; on this very machine with its pid gone or
a zombie; in this process and let go). Anything else is watched for a TTL. (The TTL rules in virtual
time: tests/server/test_remote_state.py; coordinators: tests/coordinator/test_owner.py.)"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from vcasync.backends.memory import MemoryStorage

from vcasync._owner_lease import OwnerLease, OwnerRecord, this_node
from vcasync.errors import PrefixTakenError

pytestmark = pytest.mark.skipif(this_node() is None, reason="needs /proc (Linux) to tell a pid's fate")


def refused(message: str, holder: str | None) -> PrefixTakenError:
    return PrefixTakenError(message)


def lease(store: MemoryStorage, **kw: object) -> OwnerLease:
    return OwnerLease(store.peer(), error=refused, prefix="p/owner/", ttl_s=30.0, subject="the run",
                      role="coordinator", **kw)  # type: ignore[arg-type]


async def plant(store: MemoryStorage, *, pid: int, node: str | None, holder: str = "h0") -> None:
    now = time.time()
    rec = OwnerRecord(holder, "elsewhere", pid, 30.0, 3, now, False, now - 5, node)
    await store.put("p/owner/000000000001.json", rec.to_bytes())


async def _taken_at_once(store: MemoryStorage) -> bool:
    newcomer = lease(store)
    try:
        await asyncio.wait_for(newcomer.acquire(poll_s=0.01), 0.5)
    except TimeoutError:
        return False
    assert newcomer.epoch == 2
    return True


def holder_taken_at_once(pid: int, node: str | None) -> bool:
    """A newcomer facing a live-looking record of ``pid`` on ``node``: did it take over at once?"""
    async def go() -> bool:
        store = MemoryStorage("s")
        await plant(store, pid=pid, node=node)
        return await _taken_at_once(store)
    return asyncio.run(go())


def test_a_holder_on_this_machine_whose_process_is_gone_is_taken_over_at_once() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert holder_taken_at_once(gone.pid, this_node())


def test_a_killed_holder_not_yet_reaped_is_dead_too() -> None:
    zombie = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        zombie.kill()
        for _ in range(200):                       # dead, but its parent (us) has not reaped it
            with open(f"/proc/{zombie.pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] == "Z":
                    break
            time.sleep(0.01)
        assert holder_taken_at_once(zombie.pid, this_node())
    finally:
        zombie.wait()


def test_a_running_pid_or_another_machine_is_watched_not_presumed_dead() -> None:
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not holder_taken_at_once(alive.pid, this_node())   # alive (or a reused pid): wait
    finally:
        alive.kill()
        alive.wait()
    assert not holder_taken_at_once(alive.pid, "another-host/another-boot/pid:[1]")   # means nothing here
    assert not holder_taken_at_once(alive.pid, None)   # a holder that could not say where it ran


async def test_in_this_process_a_lease_let_go_is_free_and_a_held_one_is_not() -> None:
    store = MemoryStorage("s")
    first = lease(store)
    await first.acquire()
    assert not await _taken_at_once(store)          # held by a live object of this process
    first.abandon()                                 # what a crash leaves
    assert await _taken_at_once(store)


async def test_records_from_before_the_new_fields_still_read() -> None:
    old = (b'{"holder": "h", "host": "x", "pid": 7, "ttl_s": 30.0, "beat": 2, '
           b'"renewed_at": 100.0, "released": false}')
    rec = OwnerRecord.from_bytes(old)
    assert rec is not None
    assert (rec.node, rec.since) == (None, 100.0)
    assert rec.describe() == "host x, pid 7, since 1970-01-01 00:01:40 UTC"
    assert OwnerRecord.from_bytes(b"[1, 2]") is None
