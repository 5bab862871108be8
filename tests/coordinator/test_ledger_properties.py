"""Random interleavings of lease / heartbeat / expire / submit / release / refuse / requeue / restart in
virtual time.

Invariants after every step: each unit is in exactly one state and the ledger's indexes agree with
it, no unit is merged twice, no step of work is lost (merged steps + open steps = what was asked), a
parked unit failed on enough distinct workers, and the lease counters cover what the units record.
"""

from __future__ import annotations

import contextlib
from collections import Counter, defaultdict

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from vcasync.errors import LedgerError, ValidationError
from vcasync.ledger import LeaseState, Ledger, LedgerConfig, UnitState
from vcasync.ledger._columns import UnitStates
from vcasync.ledger._units import WorkUnit

SECRET = b"k" * 32


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class LedgerMachine(RuleBasedStateMachine):
    workers = Bundle("workers")
    leases = Bundle("leases")

    @initialize(n=st.integers(1, 5), steps=st.integers(1, 6), attempts=st.integers(1, 4),
                park_workers=st.integers(1, 3), quarantine=st.integers(1, 6))
    def setup(self, n: int, steps: int, attempts: int, park_workers: int, quarantine: int) -> None:
        self.clock = Clock()
        self.config = LedgerConfig(lease_timeout_s=10.0, max_attempts=attempts,
                                   park_after_workers=park_workers, quarantine_after=quarantine,
                                   worker_backoff_s=2.0, quarantine_s=30.0)
        self.ledger = Ledger([WorkUnit(f"u{i}", steps=steps) for i in range(n)], config=self.config,
                             clock=self.clock, secret=SECRET)
        self.asked = {f"u{i}": steps for i in range(n)}
        self.merged: Counter[str] = Counter()          # unit id -> accepted results
        self.merged_steps: defaultdict[str, int] = defaultdict(int)   # root -> steps merged
        self.version = 0
        self.saved: tuple | None = None

    @rule(target=workers)
    def join(self) -> str:
        return self.ledger.join()

    @rule(target=leases, w=workers)
    def lease(self, w: str) -> tuple[str, str]:
        try:
            g = self.ledger.lease(w, self.version)
        except LedgerError:
            return ("", w)
        return (g.lease_id, w)

    @rule(lw=leases, steps=st.integers(0, 7))
    def heartbeat(self, lw: tuple[str, str], steps: int) -> None:
        if lw[0]:
            with contextlib.suppress(LedgerError, ValidationError):
                self.ledger.heartbeat(lw[1], lw[0], steps)

    @rule(dt=st.floats(0.0, 25.0))
    def advance(self, dt: float) -> None:
        self.clock.now += dt

    @rule(target=leases, w=workers)
    def reissue(self, w: str) -> tuple[str, str]:
        """Let every lease run out, then lease again: the path that makes late results."""
        self.clock.now += 11.0
        return self.lease(w)

    @rule()
    def expire(self) -> None:
        self.ledger.expire()

    @rule(lw=leases, reason=st.sampled_from(["", "preempted"]), failed=st.booleans())
    def release(self, lw: tuple[str, str], reason: str, failed: bool) -> None:
        if lw[0]:
            with contextlib.suppress(LedgerError):
                self.ledger.release(lw[1], lw[0], reason, failed=failed)

    @rule(lw=leases)
    def refuse(self, lw: tuple[str, str]) -> None:
        if lw[0]:
            self.ledger.refuse(lw[1], lw[0], "non_finite")

    @rule(everything=st.booleans())
    def requeue(self, everything: bool) -> None:
        parked = list(self.ledger.parked())
        done = self.ledger.requeue(None if everything else parked[:1])
        assert done == (parked if everything else parked[:1])

    @rule(lw=leases, other=workers)
    def resume(self, lw: tuple[str, str], other: str) -> None:
        if lw[0]:
            with contextlib.suppress(LedgerError):
                self.ledger.resume(other, lw[0])

    @rule(lw=leases, accept=st.booleans(), frac=st.floats(0.0, 1.0), partial=st.booleans())
    def submit(self, lw: tuple[str, str], accept: bool, frac: float, partial: bool) -> None:
        lease_id, w = lw
        if not lease_id:
            return
        holder = self.ledger.lease_holder(lease_id) or w
        try:
            check = self.ledger.check_result(holder, lease_id)
        except LedgerError:
            return
        if check.receipt is not None:
            return      # a duplicate: nothing to do, and nothing happens
        unit = check.unit
        steps = max(1, round(unit.steps * frac)) if partial else unit.steps
        self.version += accept
        r = self.ledger.record(lease_id, unit_id=unit.unit_id, worker_id=holder,
                               status="accepted" if accept else "rejected", version=self.version,
                               reason=None if accept else "too_stale", steps_done=steps,
                               partial=partial)
        assert self.ledger.record(lease_id, unit_id=unit.unit_id, worker_id=holder,
                                  status="accepted", version=99) == r     # recorded once only
        if accept:
            self.merged[unit.unit_id] += 1
            self.merged_steps[str(unit.params.get("parent", unit.unit_id))] += steps

    @rule(new_clock=st.booleans())
    def restart(self, new_clock: bool) -> None:
        snap = self.ledger.snapshot()
        if new_clock:
            self.clock = Clock()
            self.clock.now = 1e6
        self.ledger = Ledger.restore(snap, config=self.config, clock=self.clock, secret=SECRET)
        again = self.ledger.snapshot()
        assert again["units"] == snap["units"]
        assert lease_rows(again) == lease_rows(snap)      # the same leases (in any order)

    @rule()
    def checkpoint(self) -> None:
        self.saved = (self.ledger.snapshot(), Counter(self.merged), defaultdict(
            int, self.merged_steps))

    @rule()
    def crash_back_to_checkpoint(self) -> None:
        """A coordinator crash in snapshot mode: everything after the checkpoint is forgotten, so
        leases granted since are unknown and get adopted (signed ids) when they come back."""
        if self.saved is None:
            return
        snap, merged, steps = self.saved
        self.ledger = Ledger.restore(snap, config=self.config, clock=self.clock, secret=SECRET)
        self.merged, self.merged_steps = Counter(merged), defaultdict(int, steps)

    @invariant()
    def consistent(self) -> None:
        led = self.ledger
        units = led._units
        queued = [uid for uid, u in units.items() if u.state is UnitState.QUEUED]
        assert sorted(led._queue) == sorted(queued)
        assert len(set(led._queue)) == len(led._queue)
        active = {lid for lid, lse in led._leases.items() if lse.state is LeaseState.ACTIVE}
        leased = {u.lease_id for u in units.values() if u.state is UnitState.LEASED}
        assert active == leased
        assert None not in leased
        for lid in active:
            assert units[led._leases[lid].unit_id].lease_id == lid
        for u in units.values():
            if u.state is UnitState.PARKED:
                assert len(u.failed_by) >= self.config.park_workers
                assert u.attempts >= self.config.max_attempts
        assert led.stats["issued"] >= sum(u.issued for u in units.values())
        # the open leases (what scans for bases read) are exactly those whose result may come
        may_come = {lid for lid, lse in led._leases.items()
                    if lse.state in (LeaseState.ACTIVE, LeaseState.EXPIRED, LeaseState.RELEASED)}
        assert set(led._open) == may_come
        assert all(led._leases[lid].receipt is None for lid in may_come)
        assert len(led._archive) + len(led._open) == len(led._leases)
        assert led.parked() == {u.unit.unit_id: u.reason or "" for u in led._order
                                if u.state is UnitState.PARKED}
        # a capture reads again only the units touched since the last one: it must still agree
        # with every unit read afresh (a change made without touching its unit would not)
        units_snap = led.snapshot()["units"]
        fresh = UnitStates().table(led._order)          # an empty cache reads every unit
        assert {k: units_snap[k] for k in fresh} == fresh
        counts = led.counts()
        assert sum(counts.values()) == len(units)
        actual = Counter(u.state.value for u in units.values())
        assert all(counts[s.value] == actual[s.value] for s in UnitState)

    @invariant()
    def exactly_once_and_nothing_lost(self) -> None:
        led = self.ledger
        assert all(n == 1 for n in self.merged.values())
        if led.stats["adopted"]:
            event("a lease granted after the last snapshot was adopted")
        done = {uid for uid, u in led._units.items() if u.state is UnitState.DONE}
        assert done == set(self.merged)
        open_steps: defaultdict[str, int] = defaultdict(int)
        for uid, u in led._units.items():
            if u.state is not UnitState.DONE:
                open_steps[str(u.unit.params.get("parent", uid))] += u.unit.steps
        for root, asked in self.asked.items():
            assert self.merged_steps[root] + open_steps[root] == asked
        accepted = [x.receipt for x in led._leases.values()
                    if x.receipt is not None and x.receipt.status == "accepted"]
        assert len(accepted) == len({r.unit_id for r in accepted}) == len(done)


LedgerMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestLedgerMachine = LedgerMachine.TestCase


def lease_rows(snap: dict) -> list[tuple]:
    """A snapshot's leases as sorted rows, without their remaining seconds (a restore gives an
    active lease at least the grace period)."""
    table = {k: v for k, v in snap["leases"].items() if k != "remaining"}
    return sorted(zip(*table.values(), strict=True))
