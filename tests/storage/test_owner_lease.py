"""The owner lease's takeover rules that need no waiting: a holder is taken over at once only when it
is provably dead (released; on this very machine with its pid gone or a zombie; in this process and
let go; on another machine and over a day stale by the wall clock). Anything else is watched for a
TTL. (The TTL rules in virtual time: tests/server/test_remote_state.py; coordinators:
tests/coordinator/test_owner.py.)"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

import pytest
from vcasync.backends.memory import MemoryStorage

from vcasync._owner_lease import LONG_DEAD_S, OwnerLease, OwnerRecord, this_node
from vcasync.errors import PrefixTakenError, StorageUnavailableError

pytestmark = pytest.mark.skipif(this_node() is None, reason="needs /proc (Linux) to tell a pid's fate")


def refused(message: str, holder: str | None) -> PrefixTakenError:
    return PrefixTakenError(message)


def lease(store: MemoryStorage, **kw: object) -> OwnerLease:
    return OwnerLease(store.peer(), error=refused, prefix="p/owner/", ttl_s=30.0, subject="the run",
                      role="coordinator", **kw)  # type: ignore[arg-type]


async def plant(store: MemoryStorage, *, pid: int, node: str | None, holder: str = "h0",
                age_s: float = 0.0) -> None:
    """A record of ``pid`` on ``node``, renewed ``age_s`` ago by our clock (its clock may be behind)."""
    now = time.time() - age_s
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


def holder_taken_at_once(pid: int, node: str | None, age_s: float = 0.0) -> bool:
    """A newcomer facing a live-looking record of ``pid`` on ``node``: did it take over at once?"""
    async def go() -> bool:
        store = MemoryStorage("s")
        await plant(store, pid=pid, node=node, age_s=age_s)
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


def test_a_running_holder_on_this_machine_is_never_presumed_dead_by_the_clocks() -> None:
    # a newcomer whose clock ran 100 s ahead took a live worker's state on the same host at once
    # ("not renewed since ..."), and the live one stopped with exit 2
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for age_s in (100.0, 3600.0, 2 * LONG_DEAD_S):
            assert not holder_taken_at_once(alive.pid, this_node(), age_s=age_s)
    finally:
        alive.kill()
        alive.wait()


def test_another_machines_record_is_taken_at_once_only_when_over_a_day_stale() -> None:
    elsewhere = "another-host/another-boot/pid:[1]"
    for age_s in (100.0, 5 * 3600.0):              # a clock minutes or hours off: watched
        assert not holder_taken_at_once(4242, elsewhere, age_s=age_s)
    assert holder_taken_at_once(4242, elsewhere, age_s=LONG_DEAD_S + 61)
    assert holder_taken_at_once(4242, None, age_s=LONG_DEAD_S + 61)   # a holder off Linux too


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


@pytest.mark.parametrize("clean", [True, False])
async def test_a_released_record_is_taken_at_once_and_says_whether_its_holder_saved_its_state(
        clean: bool) -> None:
    # found by a probe: a coordinator stopped by a storage outage (exit 4, no final snapshot)
    # released its record like a clean stop, and the next start skipped the restart grace
    store = MemoryStorage("s")
    first = lease(store)
    await first.acquire()
    await first.release(clean=clean)
    newcomer = lease(store)
    await asyncio.wait_for(newcomer.acquire(poll_s=0.01), 5.0)      # at once, either way
    assert newcomer.took_over is not clean
    assert OwnerRecord.from_bytes(b'{"holder": "h", "host": "x", "pid": 7, "ttl_s": 30.0, '
                                  b'"beat": 2, "renewed_at": 100.0, "released": true}').clean


class Hiccups:
    """The lease's storage with puts that fail while ``failing`` (reads still answer)."""

    def __init__(self, store: MemoryStorage) -> None:
        self.store = store
        self.failing = False
        self.puts = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def put(self, key: str, data: bytes, **kw: object) -> object:
        self.puts += 1
        if self.failing:
            raise StorageUnavailableError("injected: the put was refused")
        return await self.store.put(key, data, **kw)  # type: ignore[arg-type]


async def test_a_storage_hiccup_does_not_refuse_while_the_lease_is_provably_still_ours() -> None:
    # under injected storage faults a failed renewal refused the coordinator's uploads (503) though
    # nobody could have taken over yet: a newcomer needs a whole TTL after the last confirmed beat
    now = [1000.0]
    flaky = Hiccups(MemoryStorage("s").peer())
    own = OwnerLease(flaky, error=refused, prefix="p/owner/", ttl_s=30.0, subject="the run",  # type: ignore[arg-type]
                     role="coordinator", monotonic=lambda: now[0])
    await own.acquire()
    await own.renew()                      # confirmed at t=1000
    flaky.failing = True
    now[0] += 19.0
    await own.ensure()                     # fresh: no storage at all
    assert flaky.puts == 2
    now[0] += 5.0                          # 24 s old: ensure renews, the put fails, still ours
    await own.ensure()
    assert flaky.puts == 3
    assert own.held
    now[0] += 1.5                          # 25.5 s old (>= 5/6 TTL): it cannot be vouched for
    with pytest.raises(StorageUnavailableError):
        await own.ensure()
    flaky.failing = False
    await own.ensure()                     # storage back: renewed and confirmed again
    assert own.held
    assert flaky.puts == 5
    await own.release()


async def test_a_failed_renewal_is_tried_again_after_a_quarter_beat() -> None:
    flaky = Hiccups(MemoryStorage("s").peer())
    own = OwnerLease(flaky, error=refused, prefix="p/owner/", ttl_s=1.2, subject="the run",  # type: ignore[arg-type]
                     role="coordinator")
    await own.acquire()
    flaky.failing = True
    renewer = asyncio.create_task(own.keep_renewed(lambda: None))
    await asyncio.sleep(0.4 + 0.05)        # the first beat (ttl/3) failed
    assert flaky.puts == 2
    flaky.failing = False
    await asyncio.sleep(0.1 + 0.05)        # retried a quarter beat later, not a whole beat
    assert flaky.puts == 3
    renewer.cancel()
    await asyncio.gather(renewer, return_exceptions=True)
    await own.release()


async def test_info_says_who_holds_it_how_fresh_and_never_the_holder_token() -> None:
    # what GET /v1/status shows as "owner": an operator needs to see who owns a run
    now, wall = [1000.0], [1_700_000_000.0]
    store = MemoryStorage("s")
    own = OwnerLease(store.peer(), error=refused, prefix="p/owner/", ttl_s=30.0, subject="the run",
                     role="coordinator", clock=lambda: wall[0], monotonic=lambda: now[0])
    assert own.info() is None                              # nothing held yet
    await own.acquire()
    now[0] += 4.0
    info = own.info()
    assert info == {"host": socket.gethostname(), "pid": os.getpid(), "epoch": 1,
                    "since": "2023-11-14T22:13:20Z", "since_unix": 1_700_000_000.0, "ttl_s": 30.0,
                    "renewed_s_ago": 4.0, "lost": False}
    (key,) = [k async for k in store.list("p/owner/")]
    holder = json.loads(await store.get(key))["holder"]
    assert holder not in json.dumps(info)
    await own.renew()
    assert own.info()["renewed_s_ago"] == 0.0              # type: ignore[index]
    # a newcomer takes the run over (this one stalled): the next check finds it lost
    await store.put("p/owner/000000000002.json",
                    OwnerRecord("other", "elsewhere", 1, 30.0, 0, wall[0], False, wall[0]).to_bytes())
    with pytest.raises(PrefixTakenError):
        await own.check()
    info = own.info()
    assert info is not None
    assert info["lost"] is True
    assert info["renewed_s_ago"] is None                   # no confirmed renewal to vouch for it
    await own.release()
    assert own.info() is None
