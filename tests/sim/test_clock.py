"""The virtual-time event loop: timers jump, executor work runs inline, stalls are reported."""

from __future__ import annotations

import asyncio
import threading

import pytest

from vcasync.sim.clock import SimulationStalledError, VirtualClock, run_virtual


def test_sleeping_a_day_takes_no_wall_time_and_orders_timers() -> None:
    order: list[tuple[float, str]] = []

    async def main(clock: VirtualClock) -> float:
        async def sleeper(name: str, seconds: float) -> None:
            await asyncio.sleep(seconds)
            order.append((clock.now, name))

        async with asyncio.TaskGroup() as tg:
            tg.create_task(sleeper("day", 86400.0))
            tg.create_task(sleeper("hour", 3600.0))
            tg.create_task(sleeper("minute", 60.0))
        return clock.now

    assert run_virtual(main) == 86400.0
    assert order == [(60.0, "minute"), (3600.0, "hour"), (86400.0, "day")]


def test_timeouts_fire_on_virtual_time() -> None:
    async def main(clock: VirtualClock) -> float:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(30.0):
                await asyncio.Event().wait()
        return clock.now

    assert run_virtual(main) == 30.0


def test_executor_work_runs_inline_on_the_loop_thread() -> None:
    async def main(clock: VirtualClock) -> tuple[int, float]:
        ident = await asyncio.to_thread(threading.get_ident)
        return ident, clock.now

    ident, now = run_virtual(main)
    assert ident == threading.get_ident()
    assert now == 0.0


def test_executor_exceptions_reach_the_awaiting_task() -> None:
    def boom() -> None:
        raise ValueError("from the executor")

    async def main(clock: VirtualClock) -> None:
        await asyncio.to_thread(boom)

    with pytest.raises(ValueError, match="from the executor"):
        run_virtual(main)


def test_a_stalled_simulation_is_reported_not_hung() -> None:
    async def main(clock: VirtualClock) -> None:
        await asyncio.Event().wait()

    with pytest.raises(SimulationStalledError, match="stalled"):
        run_virtual(main)


def test_clock_never_goes_back() -> None:
    clock = VirtualClock(5.0)
    with pytest.raises(ValueError, match="cannot go back"):
        clock.advance(-1.0)
    assert clock() == 5.0
