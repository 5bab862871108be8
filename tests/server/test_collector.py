"""CollectorGuard: what outlives a pass is frozen (later passes do not walk it), frozen cycles are
reclaimed by its own full pass, which runs only when memory grew, and leaving it undoes it all."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest

from vcasync.errors import ConfigError
from vcasync.server import CollectorGuard, _collector


class Node:
    """A container that can sit in a reference cycle and be watched with a weak reference."""

    def __init__(self) -> None:
        self.other: Any = None


def _frozen_garbage_cycle() -> weakref.ref[Node]:
    """Two nodes referring to each other, alive through a young pass (so frozen), then dropped."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    gc.collect(0)
    ref = weakref.ref(a)
    del a, b
    return ref


@pytest.fixture
def guard() -> Any:
    g = CollectorGuard(check_s=0.05)
    g.install()
    try:
        yield g
    finally:
        g.uninstall()


def test_install_freezes_what_exists_and_uninstall_hands_it_back() -> None:
    before = gc.get_freeze_count()
    g = CollectorGuard()
    g.install()
    try:
        assert gc.get_freeze_count() > before
        assert g._after_pass in gc.callbacks
        g.install()                      # idempotent: one callback
        assert gc.callbacks.count(g._after_pass) == 1
    finally:
        g.uninstall()
    assert gc.get_freeze_count() == 0
    assert g._after_pass not in gc.callbacks
    g.uninstall()                        # idempotent


def test_survivors_of_a_young_pass_are_frozen(guard: CollectorGuard) -> None:
    keep = [Node() for _ in range(100)]
    frozen = gc.get_freeze_count()
    gc.collect(0)
    assert guard.passes["frozen_after"] >= 1
    # Nothing is left in the older generations for their passes to walk: it was frozen.
    assert not any(o is keep[0] for o in gc.get_objects(1) + gc.get_objects(2))
    assert gc.get_freeze_count() >= frozen + len(keep)
    del keep


def test_a_frozen_cycle_waits_for_the_guards_full_pass(guard: CollectorGuard) -> None:
    ref = _frozen_garbage_cycle()
    gc.collect()         # a full pass of the collector's own does not see frozen objects
    assert ref() is not None
    found = guard.full_pass()
    assert ref() is None
    assert found >= 2
    assert guard.passes["full"] == 1
    assert guard.last_full_ms > 0.0


def test_garbage_that_is_not_a_cycle_is_freed_although_frozen(guard: CollectorGuard) -> None:
    n = Node()
    ref = weakref.ref(n)
    gc.collect(0)
    del n                # reference counting frees it: freezing keeps nothing alive
    assert ref() is None


def test_a_full_pass_is_due_only_when_memory_grew_and_time_went_by(
        guard: CollectorGuard, monkeypatch: pytest.MonkeyPatch) -> None:
    rss = {"now": 1000}
    monkeypatch.setattr(_collector, "resident_bytes", lambda: rss["now"])
    guard.full_pass()                 # base: 1000 bytes, now
    guard.full_every_s = 3600.0
    rss["now"] = 10_000
    assert not guard.due()            # grown, but the last full pass was just now
    guard.full_every_s = 0.0
    assert guard.due()
    rss["now"] = 1200                 # within regrow (25 %) of the base
    assert not guard.due()
    monkeypatch.setattr(_collector, "resident_bytes", lambda: None)
    assert guard.due()                # memory unknown: the time alone decides


def test_the_watch_runs_the_full_pass_and_leaving_stops_it(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> tuple[int, weakref.ref[Node]]:
        async with CollectorGuard(full_every_s=0.0, regrow=0.01, check_s=0.02) as g:
            rss = {"now": g._base or 1}
            monkeypatch.setattr(_collector, "resident_bytes", lambda: rss["now"])
            ref = _frozen_garbage_cycle()
            gc.collect()
            assert ref() is not None
            rss["now"] *= 2           # memory grew: the next check reclaims the frozen cycle
            for _ in range(200):
                if g.passes["full"]:
                    break
                await asyncio.sleep(0.01)
            return g.passes["full"], ref

    full, ref = asyncio.run(main())
    assert full >= 1
    assert ref() is None
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("kwargs", [{"freeze_from": 3}, {"regrow": 0.0}, {"check_s": 0.0},
                                    {"full_every_s": -1.0}])
def test_bad_settings_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        CollectorGuard(**kwargs)
