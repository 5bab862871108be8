"""SIGTERM stops a benchmark as Ctrl-C does: through its clean-ups, and with a non-zero exit.

A CI job's time-out sends SIGTERM to the benchmark's process alone. With the default action the
benchmark died at once and left its peers (coordinators, S3/GCS emulators, merger processes) running
and its temporary directories in TMPDIR. :func:`stop_on_sigterm` turns the signal into the
interrupt Ctrl-C gives: SIGINT is raised when it has a handler (Python's, which raises
KeyboardInterrupt, or the one ``asyncio.run`` installs, which cancels the run so its clean-ups
await), and KeyboardInterrupt is raised directly when SIGINT is ignored, as it is in a background
job of a non-interactive shell (``bench ... &`` in a CI script), where raising SIGINT did nothing
and the benchmark ran on to the end and exited 0.

The signal is also remembered: a KeyboardInterrupt raised inside a finaliser (``__del__``, a weakref
or GC callback) is printed ("Exception ignored") and dropped, so long loops call
:func:`raise_if_stopped` to raise it again.

An event loop is stopped at a safe point instead (:func:`run_async`, the benchmarks' ``asyncio.run``):
its main task is cancelled, as ``asyncio.run`` does on Ctrl-C, so its clean-ups run. Raised wherever
the loop was, the KeyboardInterrupt could land in a finaliser and be dropped: the run then went on to
its end (CI: ``bench.convergence`` with SIGINT ignored did not stop within 90 s of its SIGTERM).
"""

from __future__ import annotations

import asyncio
import functools
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import Any, ParamSpec, TypeVar

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: The signals that asked this process to stop, in order of arrival.
RECEIVED: list[int] = []


def _stop(signum: int, frame: FrameType | None) -> None:
    RECEIVED.append(signum)
    if callable(signal.getsignal(signal.SIGINT)):
        signal.raise_signal(signal.SIGINT)
    else:   # SIGINT ignored (a background job of a non-interactive shell): raising it does nothing
        raise KeyboardInterrupt(f"signal {signum}")


def stop_on_sigterm() -> None:
    """From now on SIGTERM interrupts this process as Ctrl-C does (main thread only); a ``main``
    that calls it is decorated with :func:`restores_sigterm`, so that it lasts only as long as
    the benchmark."""
    signal.signal(signal.SIGTERM, _stop)


def restores_sigterm(main: Callable[_P, _R]) -> Callable[_P, _R]:
    """``main`` with the SIGTERM handling it found given back when it returns or raises: the
    tests call benchmarks' ``main()`` in their own process, which kept :func:`_stop` as its
    SIGTERM handler after them (a later SIGTERM to that process raised KeyboardInterrupt
    wherever it was instead of ending it). Main thread only, as setting handlers is."""
    @functools.wraps(main)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if threading.current_thread() is not threading.main_thread():
            return main(*args, **kwargs)
        before = signal.getsignal(signal.SIGTERM)
        try:
            return main(*args, **kwargs)
        finally:
            signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)
    return run


def run_async(main: Coroutine[Any, Any, _R]) -> _R:
    """``asyncio.run(main)``, stopped at a safe point by SIGTERM when :func:`stop_on_sigterm` is in
    force: the loop's own handler cancels ``main``'s task (its ``finally`` clauses and clean-ups
    run), and KeyboardInterrupt is raised once it has ended, whether SIGINT is ignored or not. A
    later SIGTERM is only recorded: a second cancel would cut those clean-ups short. Elsewhere (a
    thread, SIGTERM handled otherwise) a plain ``asyncio.run``."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not _stop):
        return asyncio.run(main)

    async def guarded() -> _R:
        task = asyncio.current_task()
        assert task is not None

        def on_sigterm() -> None:
            RECEIVED.append(signal.SIGTERM)
            if RECEIVED.count(signal.SIGTERM) == 1:
                task.cancel()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        try:
            return await main
        except asyncio.CancelledError:
            if RECEIVED:
                raise KeyboardInterrupt(f"signal {RECEIVED[0]}") from None
            raise
        finally:
            loop.remove_signal_handler(signal.SIGTERM)   # leaves SIG_DFL: ours is set back below
            signal.signal(signal.SIGTERM, _stop)

    try:
        return asyncio.run(guarded())
    finally:
        signal.signal(signal.SIGTERM, _stop)


def exit_with(main: Callable[[], int | None], name: str) -> None:
    """A benchmark's ``if __name__ == "__main__"``: ``sys.exit(main())``, and a stop by a signal
    (SIGTERM through :func:`stop_on_sigterm`, or Ctrl-C) ends with one line on stderr and the
    shell's status for that signal (143 for SIGTERM, 130 for SIGINT) once its clean-ups ran. Until
    2026-12-08 the KeyboardInterrupt reached the interpreter, which printed its traceback (the
    clean-ups had run: the stop was right, the traceback said a crash) and exited 1."""
    try:
        code = main()
    except KeyboardInterrupt:
        signum = RECEIVED[0] if RECEIVED else signal.SIGINT
        print(f"python -m {name}: stopped by {signal.Signals(signum).name}; its processes and "
              "temporary files were cleaned up", file=sys.stderr, flush=True)
        sys.exit(128 + signum)
    sys.exit(code)


def raise_if_stopped() -> None:
    """Raise KeyboardInterrupt if a signal asked this process to stop (one a finaliser swallowed)."""
    if RECEIVED:
        raise KeyboardInterrupt(f"signal {RECEIVED[0]}")


def start_process(cmd: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(cmd, **kwargs)``, the process never left running by an interrupt that came
    while it started: SIGTERM and SIGINT are held until Popen returns; if one came, the process is
    killed (and reaped) and the signal then raised as it would have been. Without this, SIGTERM
    sent as the child appeared (a CI time-out, the tests' "at once" case) raised inside Popen or
    before the caller's ``try``, and the child outlived the benchmark. Held only in the main
    thread (the only one that may set handlers); elsewhere a plain Popen."""
    if threading.current_thread() is not threading.main_thread():
        return subprocess.Popen(cmd, **kwargs)
    held: list[int] = []
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    for signum, handler in before.items():
        if handler is not signal.SIG_IGN:
            signal.signal(signum, lambda signum, frame: held.append(signum))
    proc: subprocess.Popen[Any] | None = None
    try:
        proc = subprocess.Popen(cmd, **kwargs)
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        if held and proc is not None:
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        for came in held:
            signal.raise_signal(came)
    return proc
