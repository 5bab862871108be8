"""Virtual time for the fleet simulator: an asyncio event loop whose clock jumps instead of waiting.

The simulator runs the *real* coordinator, ledger and merge policies, which are asyncio code that
sleeps, waits on deadlines and reads a clock. Rather than re-implement them on a discrete-event
queue, we run them on an event loop whose ``time()`` is a :class:`VirtualClock`: whenever every task
is blocked, the loop's selector advances the clock straight to the next timer instead of sleeping
(the "autojump" clock that trio's testing tools popularised). A simulated day of a thousand workers
then takes as long as the Python code it executes, and nothing depends on the wall clock.

Two rules keep a run deterministic for a seed:

* work handed to ``run_in_executor`` (``asyncio.to_thread``) runs inline, at once, on the loop's
  thread: in virtual time CPU work is free, and a real thread would let the wall clock decide the
  order of events;
* the loop refuses to wait on nothing: when no task can ever wake up, :class:`SimulationStalledError`
  names the problem instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextvars
import selectors
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, TypeVar, TypeVarTuple, Unpack

__all__ = ["SimulationStalledError", "VirtualClock", "VirtualEventLoop", "run_virtual"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class SimulationStalledError(RuntimeError):
    """Every task of a simulation waits for something that can never happen (no timer is pending).

    A bug in the simulated system or the simulator (a lost wake-up), not bad input: hence a
    ``RuntimeError`` rather than a member of the :class:`~vcasync.errors.VCAsyncError` tree.
    """


class VirtualClock:
    """Seconds of simulated time; call it to read it (it fits ``clock=`` parameters)."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def __call__(self) -> float:
        return self._now

    @property
    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds} s)")
        self._now += seconds


class _JumpingSelector(selectors.SelectSelector):
    """A selector that, instead of blocking for ``timeout`` seconds, moves the clock forward by it."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)  # the loop's own wake-up pipe, if anything wrote to it
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise SimulationStalledError(
                "the simulation stalled: every task waits and no timer is pending "
                "(a worker or the coordinator is waiting for an event that never comes)")
        self._clock.advance(timeout)
        return []


class VirtualEventLoop(asyncio.SelectorEventLoop):
    """An event loop on a :class:`VirtualClock`; executor work runs inline (see the module doc)."""

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock if clock is not None else VirtualClock()
        super().__init__(selector=_JumpingSelector(self.clock))

    def time(self) -> float:
        return self.clock.now

    def run_in_executor(self, executor: Executor | None, func: Callable[[Unpack[Ts]], T],
                        *args: *Ts) -> asyncio.Future[T]:
        fut: asyncio.Future[T] = self.create_future()
        try:
            fut.set_result(func(*args))
        except BaseException as exc:  # delivered to the awaiting task, as a thread would
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            fut.set_exception(exc)
        return fut


def run_virtual(main: Callable[[VirtualClock], Awaitable[T]] | Coroutine[Any, Any, T],
                clock: VirtualClock | None = None) -> T:
    """Run ``main`` to completion on a fresh :class:`VirtualEventLoop` and close the loop.

    ``main`` is a coroutine, or a function taking the clock and returning an awaitable (handy when
    the code under test needs the clock object, e.g. ``Coordinator(clock=clock)``).
    """
    clk = clock if clock is not None else VirtualClock()

    async def _entry() -> T:
        if callable(main):
            return await main(clk)
        return await main

    with asyncio.Runner(loop_factory=lambda: VirtualEventLoop(clk)) as runner:
        return runner.run(_entry(), context=contextvars.copy_context())
