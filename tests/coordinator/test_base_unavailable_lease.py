"""Why a worker does not resend full weights after ``base_unavailable`` (docs/limits.md said it did):
the refusal closes the lease, so a second upload on it, full weights included, only gets the same
refusal back; the unit is queued again, not counted against the worker, and trained again."""

from __future__ import annotations

from vcasync.ledger import UnitState

from .test_coordinator import coordinator, submit


async def test_a_base_unavailable_refusal_closes_the_lease_and_queues_the_unit_again(
        kit, clock, policy) -> None:
    nbytes = kit.tiny_model().nbytes
    async with coordinator(kit, clock, policy, units=7, max_retained_bytes=2 * nbytes) as coord:
        w = await coord.join()
        old = await coord.lease(w)
        delta = kit.delta_like(coord.model())
        for _ in range(3):
            if coord.version:
                await coord.lease(w)
            g = await coord.lease(w)
            await submit(kit, coord, w, g, delta, base_version=coord.version)
        r = await submit(kit, coord, w, old, delta)
        assert (r.status, r.reason) == ("rejected", "base_unavailable")
        version = coord.version
        weights = {k: v + 0.5 if v.is_floating_point() else v for k, v in coord.model().items()}
        again = await submit(kit, coord, w, old, weights, kind="weights", base_version=version)
        assert (again.status, again.reason) == ("rejected", "base_unavailable")   # the same receipt
        assert coord.version == version                                        # nothing merged
        assert coord._ledger.unit_state(old.unit.unit_id) is UnitState.QUEUED   # trained again
