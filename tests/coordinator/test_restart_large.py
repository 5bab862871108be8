"""A run past a few thousand units restarts: its ledger snapshot outgrows the limits meant for one
network message (1 MiB of metadata, 100,000 items), and a coordinator must still read back what it
wrote itself. Found by a 6,000-unit run that, after a clean stop, could not start again."""

from __future__ import annotations

import pytest

from vcasync.errors import FrameError, LimitExceededError
from vcasync.storage import open_storage
from vcasync.wire import Limits, pack_tree, unpack_tree

from .test_recovery import crash, make, submit

UNITS = 100_500      # more rows than one message's max_items, whatever a row's size


def too_large_for_a_message(coord) -> bool:
    try:
        unpack_tree(pack_tree(coord._ledger.snapshot()))
    except LimitExceededError:
        return True
    return False


async def run_some(kit, coord, *, leased: int, merged: int) -> tuple[str, list]:
    w = await coord.join("w")
    for _ in range(merged):
        assert (await submit(kit, coord, w, await coord.lease(w))).status == "accepted"
    return w, [await coord.lease(w) for _ in range(leased - merged)]


@pytest.mark.parametrize("stop", ["clean", "crash"])
async def test_a_run_of_many_units_restarts_with_its_ledger(kit, clock, stop) -> None:
    async with open_storage("memory://large-ledger") as storage:
        a = await make(kit, storage, clock, units=UNITS, snapshot_every=5,
                       max_leases_per_worker=None).__aenter__()     # one worker holds 28
        w, grants = await run_some(kit, a, leased=40, merged=12)
        before = a.status()
        # the point of the test: this ledger is larger than one message may be
        assert too_large_for_a_message(a)
        if stop == "clean":
            await a.aclose()
        else:
            await crash(a)          # the snapshot after merge 10 holds the ledger; 11-12 replay
        async with make(kit, storage, clock, units=UNITS, snapshot_every=5, max_leases_per_worker=None) as b:
            assert before["units"] == {"queued": UNITS - 40, "leased": 28, "done": 12, "parked": 0}
            if stop == "clean":
                assert b.status()["units"] == before["units"]
            else:     # leases granted after the last snapshot come back when their workers do
                assert b.status()["units"] == {"queued": UNITS - 12, "leased": 0, "done": 12,
                                               "parked": 0}
            assert b.model().version == a.model().version == 12
            # the workers carry on: a lease from before the stop is still theirs
            await b.heartbeat(w, grants[5].lease_id, 1)
            assert (await submit(kit, b, w, grants[5])).status == "accepted"


def test_stored_state_limits_follow_the_bytes_in_hand() -> None:
    tree = {"rows": [[f"unit-{i}", i, None] for i in range(100_001)]}   # > 1 MiB, > 100k items
    data = pack_tree(tree)
    with pytest.raises(LimitExceededError, match="max_header_bytes"):
        unpack_tree(data)                         # one message's limits refuse it
    limits = Limits().for_stored_state(len(data))
    assert unpack_tree(data, limits=limits) == tree
    # what is not there cannot be declared: a preamble claiming more bytes than the object holds
    # fails as truncated instead of being waited for or allocated
    with pytest.raises(FrameError):
        unpack_tree(data[: len(data) // 2], limits=Limits().for_stored_state(len(data) // 2))
    # the bounds that do not grow with a run stay as configured
    assert limits.max_depth == Limits().max_depth
    assert limits.max_tensors == Limits().max_tensors
    assert Limits(max_meta_bytes=10 << 20).for_stored_state(5).max_meta_bytes == 10 << 20
