"""Processes the demo starts and kills: the coordinator and the worker slots, with a timeline.

Each :class:`Slot` is one worker "machine": a ``vcasync worker`` process with its own state dir, so a
restart after a preemption resumes its lease like a spot VM that comes back with its disk. Every start,
signal and exit is written to the shared :class:`Timeline` with the wall-clock time since the run began.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from .._spawn import module_command

__all__ = ["Proc", "Slot", "SlotState", "Timeline", "TimelineEvent"]

SlotState = str  # "starting" | "running" | "preempted" | "done" | "failed"


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    t_s: float
    who: str
    kind: str
    detail: str = ""

    def as_dict(self) -> dict[str, object]:
        return {"t_s": round(self.t_s, 3), "who": self.who, "kind": self.kind, "detail": self.detail}


@dataclass(slots=True)
class Timeline:
    """Events in order, timed from ``t0`` (``time.monotonic``)."""

    t0: float = field(default_factory=time.monotonic)
    events: list[TimelineEvent] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def add(self, who: str, kind: str, detail: str = "") -> None:
        self.events.append(TimelineEvent(self.now(), who, kind, detail))


class Proc:
    """One child process (``python -m vcasync ...``) with its output in a log file."""

    def __init__(self, name: str, args: Sequence[str], *, env: Mapping[str, str], log_path: Path) -> None:
        self.name = name
        self.args = list(args)
        self.env = dict(env)
        self.log_path = log_path
        self._proc: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has exited (``-N``: killed by signal ``N``), else None."""
        return self._proc.returncode if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        self._close_log()
        self._log = self.log_path.open("ab")
        self._proc = await asyncio.create_subprocess_exec(
            *module_command("vcasync", *self.args), env={**os.environ, **self.env},
            stdin=asyncio.subprocess.DEVNULL, stdout=self._log, stderr=asyncio.subprocess.STDOUT)

    def send(self, sig: signal.Signals) -> bool:
        if self._proc is None or self._proc.returncode is not None:
            return False
        try:
            self._proc.send_signal(sig)
        except ProcessLookupError:
            return False
        return True

    async def wait(self, within_s: float | None = None) -> int | None:
        """The exit code, or None if still running after ``within_s`` seconds."""
        if self._proc is None:
            return None
        try:
            async with asyncio.timeout(within_s):
                return await self._proc.wait()
        except TimeoutError:
            return None

    async def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``grace_s``; the exit code."""
        if self.send(signal.SIGTERM):
            code = await self.wait(grace_s)
            if code is not None:
                self._close_log()
                return code
            self.send(signal.SIGKILL)
        code = await self.wait(10.0)
        self._close_log()
        return code

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


@dataclass(slots=True)
class Slot:
    """One worker machine: its process, its state, and when it may come back."""

    index: int
    proc: Proc
    state: SlotState = "starting"
    starts: int = 0
    preemptions: int = 0
    kills: int = 0
    up_since: float | None = None
    uptime_s: float = 0.0
    sessions: list[tuple[float, float]] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.proc.name

    def went_up(self, t: float) -> None:
        if self.proc.pid is not None:
            self.pids.append(self.proc.pid)
        self.up_since = t
        self.starts += 1
        self.state = "running"

    def went_down(self, t: float, state: SlotState) -> None:
        if self.up_since is not None:
            self.sessions.append((self.up_since, t))
            self.uptime_s += t - self.up_since
            self.up_since = None
        self.state = state
