"""SIGTERM and SIGINT from the first moment of a ``vcasync`` command, kept until it can stop cleanly.

A worker on a loaded spot machine spends seconds importing torch, the trainer and the HTTP client
before its event loop runs; a preemption notice in that time killed it (exit 143) although a
SIGTERMed worker exits 0. :func:`hold` (``vcasync.cli.main`` calls it first thing, before any heavy
import) makes both signals only remembered. A command that stops cleanly on them (``worker``,
``coordinator``: :attr:`vcasync.cli.Command.handles_signals`) calls :func:`handover` once its
event loop runs: from then on each signal calls its stop, at once if one came before. ``demo``,
which stops on handlers of its own, sets them with :func:`take_over` first thing and acts on a
signal that came before as on one that comes later. For any
other command ``cli.main`` calls :func:`release` before it runs: the default handling is back, and a
signal that came meanwhile acts as it would have (SIGINT: ``KeyboardInterrupt``; SIGTERM: the
process ends by it).

A second signal before the hand-over (start-up stuck in user code, an operator who means it) is not
held: the defaults are back and it acts as it would have; the first, held, is still heard at the
hand-over (it was lost when the second was ignored: SIGINT inherited as ignored by ``cmd &``).

At the other end, once a command has returned its exit status (a worker's loop closed and, with
it, the loop's handlers), the console script calls :func:`ignore_while_exiting`, which ignores both
signals for what is left of the process (interpreter shutdown, torch's teardown: 0.1-0.3 s): a
preemption notice to a worker that had just finished found the default handling back and turned
its exit 0 into 143. ``main()`` called in-process gives back what :func:`hold` found instead
(:func:`give_back`): a loop's handlers outlive the loop (uvloop's do nothing once it is closed).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:     # nothing heavy here: imported before everything else the command needs
    import asyncio
    from types import FrameType

__all__ = ["SIGNALS", "give_back", "handover", "hold", "ignore_while_exiting", "received", "release",
           "take_over"]

#: The signals a command stops on.
SIGNALS = (signal.SIGTERM, signal.SIGINT)

_received: list[int] = []
_held = False
_previous: dict[int, Any] = {}


def hold() -> None:
    """Remember SIGTERM and SIGINT instead of acting on them, until :func:`handover` or
    :func:`release`. Only the main thread sets signal handlers: anywhere else nothing is held."""
    global _held
    if threading.current_thread() is not threading.main_thread():
        return
    _received.clear()
    for sig in SIGNALS:
        _previous[sig] = signal.signal(sig, _remember)
    _held = True


def received() -> int | None:
    """The first signal that came while held (held since :func:`hold`), or None."""
    return _received[0] if _received else None


def handover(loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> None:
    """Call ``stop`` on ``loop`` for each SIGTERM and SIGINT from now on, and once now if one came
    while held. Call it from a coroutine running on ``loop``, in the main thread."""
    global _held
    for sig in SIGNALS:
        loop.add_signal_handler(sig, stop)
    came, _held = bool(_received), False    # held, or held before a second one that was ignored
    if came:
        stop()


def ignore_while_exiting() -> None:
    """Ignore SIGTERM and SIGINT from now on: the command that heard them has stopped and returned
    its exit status, which a late signal must not replace (main thread only, as :func:`hold`)."""
    global _held
    if threading.current_thread() is not threading.main_thread():
        return
    _held = False
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def release(*, act: bool = True) -> None:
    """The handling from before :func:`hold` back (a no-op after :func:`handover`); with ``act``, a
    signal that came while held acts as it would have then."""
    global _held
    if not _held:
        return
    _held = False
    _restore()
    if act and _received:
        _act(_received[0])


def give_back() -> None:
    """The handling :func:`hold` found back, whatever the command set since, for a caller that
    goes on after the command returned (``main()`` called in-process). An event loop's handlers
    outlive it: uvloop leaves its own installed after it closes (a handler of a closed loop, which
    does nothing: Ctrl-C no longer stopped a program that had run ``main(["coordinator", ...])``),
    and plain asyncio puts back the defaults, not what was there. Main thread only, as
    :func:`hold`; a no-op when nothing was held."""
    global _held
    if threading.current_thread() is not threading.main_thread() or not _previous:
        return
    _held = False
    _restore()
    _previous.clear()


def take_over() -> int | None:
    """For a command that sets its own signal handlers instead of an event loop's (``vcasync
    demo``): the handling from before :func:`hold` back, a signal that came while held *not* acted
    on but returned (None: none came, or nothing was held), for the command to act on as it does on
    its own. Call it with the signals blocked (``signal.pthread_sigmask``) and set the command's
    handlers before unblocking them, so that none lands on the default handling in between."""
    global _held
    if not _held:
        return None
    _held = False
    _restore()
    return _received[0] if _received else None


def _remember(signum: int, frame: FrameType | None) -> None:
    global _held
    if _received:      # the second one: not held
        _held = False
        _restore()
        _act(signum)
        return
    _received.append(signum)


def _restore() -> None:
    for sig in SIGNALS:
        previous = _previous.get(sig)   # None: set outside Python, taken as the default
        signal.signal(sig, signal.SIG_DFL if previous is None else previous)


def _act(signum: int) -> None:
    if signum == signal.SIGINT and signal.getsignal(signum) is signal.default_int_handler:
        raise KeyboardInterrupt
    os.kill(os.getpid(), signum)   # its handler from before: SIGTERM's default ends the process
