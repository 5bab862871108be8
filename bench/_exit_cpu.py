"""What a preempted worker does between its SIGTERM and its exit, measured: the CPU seconds it spent.

A real worker takes 1.5-1.7 s to exit after the spot market's SIGTERM on digits (it finishes its
step, checkpoints, closes its connections, and the interpreter and torch shut down), on the cores the
other workers train on. :class:`ChildCpuSampler` reads every child process's CPU seconds
(``/proc/<pid>/stat``: user + system) 20 times a second while a real run lasts; :func:`exit_cpu`
turns the samples into one row per preemption with a notice: how long the process took to exit and
how much CPU it used meanwhile, which the replay gives the noticed session
(``SimConfig.notice_cpu``, :func:`bench.convergence.calibrate`).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Self

__all__ = ["ChildCpuSampler", "exit_cpu"]

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _candidates(parent: int) -> list[str]:
    """The pids that may be ``parent``'s children: its main thread's ``children`` file (the demo
    starts its processes from the event loop's thread), else every process (read 20 times a
    second, a scan of all of /proc took CPU from the run it measures)."""
    try:
        return Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    except OSError:
        return [e.name for e in Path("/proc").iterdir() if e.name.isdigit()]


def _children_cpu(parent: int) -> dict[int, float]:
    """pid -> CPU seconds (user + system) of every live process whose parent is ``parent``."""
    out: dict[int, float] = {}
    for pid in _candidates(parent):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # after the name: state (0), ppid (1), ..., utime (11), stime (12)
        if int(fields[1]) == parent and fields[0] != "Z":
            out[int(pid)] = (int(fields[11]) + int(fields[12])) * _TICK_S
    return out


class PeriodicSampler:
    """Calls :meth:`sample` every ``every_s`` in a daemon thread while the ``with`` block lasts."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class ChildCpuSampler(PeriodicSampler):
    """Each child process's CPU seconds over time, ``(time.monotonic(), cpu_s)`` per pid, sampled
    every ``every_s`` in a thread while the ``with`` block lasts."""

    def __init__(self, every_s: float = 0.05) -> None:
        super().__init__(every_s)
        self.samples: dict[int, list[tuple[float, float]]] = {}
        self._parent = os.getpid()

    def sample(self) -> None:
        now = time.monotonic()
        for pid, cpu in _children_cpu(self._parent).items():
            self.samples.setdefault(pid, []).append((now, cpu))


def exit_cpu(notices: list[tuple[int, float, float]], samples: dict[int, list[tuple[float, float]]],
             t0: float) -> list[dict[str, Any]]:
    """One row per ``(pid, signal_s, exit_s)`` (run clock, from monotonic ``t0``) whose process was
    sampled on both sides of its signal: ``exit_s`` (signal to exit, wall), ``cpu_s`` (CPU seconds
    from the last sample at or before the signal to the last one before the exit, up to one
    sampling interval short) and ``share`` (their ratio: the cores the exiting process kept busy)."""
    rows: list[dict[str, Any]] = []
    for pid, signal_s, exit_s in notices:
        seen = samples.get(pid, [])
        before = [cpu for t, cpu in seen if t - t0 <= signal_s]
        after = [cpu for t, cpu in seen if t - t0 > signal_s]
        wall = exit_s - signal_s
        if not before or not after or wall <= 0:
            continue
        cpu_s = max(0.0, after[-1] - before[-1])
        rows.append({"pid": pid, "signal_s": signal_s, "exit_s": wall, "cpu_s": cpu_s,
                     "share": cpu_s / wall})
    return rows
