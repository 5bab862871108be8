"""The demo's spot market on hand-made trainer events: its preemptions land inside units, at
progress read from the trainers as they write it, and it counts what it was asked for and sent.

Two ``--quick`` runs asked for 4 preemptions and fired 2, both after every unit was merged on
workers with nothing in progress: progress came from the coordinator's ``units.done`` as polled
every half second (a quick run trains all its units between two polls), and any worker whose
trainer had started was a target.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
from pathlib import Path

from vcasync.demo.market import SpotMarket
from vcasync.demo.procs import Proc, Slot, Timeline


class _Process:
    """Enough of an asyncio subprocess for :meth:`Proc.send`: a pid and the signals it got."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.signals: list[signal.Signals] = []

    def send_signal(self, sig: signal.Signals) -> None:
        self.signals.append(sig)


def _slot(index: int, pid: int, tmp: Path) -> tuple[Slot, _Process]:
    proc = Proc(f"w{index}", [], env={}, log_path=tmp / f"w{index}.log")
    fake = _Process(pid)
    proc._proc = fake  # type: ignore[assignment]
    return Slot(index, proc, state="running"), fake


def _write(events: Path, pid: int, *kinds: str) -> None:
    with (events / f"{pid}.jsonl").open("a") as f:
        for k in kinds:
            f.write(json.dumps({"t": 0.0, "pid": pid, "kind": k, "unit": "e0-s0"}) + "\n")


def _market(tmp: Path, slots: list[Slot], stop: asyncio.Event) -> SpotMarket:
    return SpotMarket(slots, Timeline(), tmp, random.Random(0), stop=stop, kill_fraction=0.0, tick_s=0.01)


async def test_a_preemption_goes_to_a_worker_inside_a_unit_and_the_rest_are_counted(tmp_path: Path) -> None:
    (done, p_done), (busy, p_busy) = _slot(0, 101, tmp_path), _slot(1, 102, tmp_path)
    _write(tmp_path, 101, "unit_start", "unit_end", "unit_start", "unit_end", "unit_start", "unit_end",
           "unit_start", "unit_end")                     # every unit trained: between units now
    _write(tmp_path, 102, "unit_start", "checkpoint")     # inside a unit
    stop = asyncio.Event()
    market = _market(tmp_path, [done, busy], stop)
    task = asyncio.create_task(market.by_progress(3, total_units=4))
    await asyncio.sleep(0.3)
    stop.set()
    await task
    assert p_busy.signals == [signal.SIGTERM]
    assert p_done.signals == []                           # with nothing in progress: never a target
    assert market.stats() == {"asked": 3, "rate_per_min": None, "fired": 1, "in_unit_at_signal": 1,
                              "not_fired": 2}


async def test_progress_is_read_from_the_trainers_as_they_write_it(tmp_path: Path) -> None:
    slot, proc = _slot(0, 201, tmp_path)
    _write(tmp_path, 201, "unit_start")
    stop = asyncio.Event()
    market = _market(tmp_path, [slot], stop)
    task = asyncio.create_task(market.by_progress(1, total_units=10))   # a point at 1-8 units trained
    await asyncio.sleep(0.2)
    assert proc.signals == []                             # in a unit, but no unit trained yet
    _write(tmp_path, 202, *["unit_start", "unit_end"] * 8)   # another worker trains 8 units
    with (tmp_path / "201.jsonl").open("a") as f:
        f.write('{"t": 0.0, "pid": 201, "kind": "unit_e')   # a line still being written: not read
    await asyncio.wait_for(task, 2.0)
    assert proc.signals == [signal.SIGTERM]
    assert market.units_ended == 8
    assert market.in_unit_at_signal == 1


def test_a_preemption_lands_part_way_into_a_unit_not_as_it_begins(tmp_path: Path) -> None:
    # at the first look after a unit_start the unit had just begun: the signal cut no training
    import time

    (fresh, _), (midway, _) = _slot(0, 301, tmp_path), _slot(1, 302, tmp_path)
    now = time.time()
    lines = [{"t": now - 10.0, "pid": 303, "kind": "unit_start"},
             {"t": now - 9.0, "pid": 303, "kind": "unit_end"},        # a typical unit: 1 s
             {"t": now - 0.01, "pid": 301, "kind": "unit_start"},
             {"t": now - 0.7, "pid": 302, "kind": "unit_start"}]
    for ev in lines:
        with (tmp_path / f"{ev['pid']}.jsonl").open("a") as f:
            f.write(json.dumps(ev) + "\n")
    market = _market(tmp_path, [fresh, midway], asyncio.Event())
    market.refresh()
    assert market.typical_unit_s() == 1.0
    assert market.training() == [fresh, midway]
    assert market.ripe(market.training(), 0.5) == [midway]   # 0.7 s into a 1-s unit; the other 0.01 s
