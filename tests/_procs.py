"""Real processes in tests: one polling loop that names what it waited for, and the live processes
whose command line names a marker (a run directory, a test's TMPDIR)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["alive", "live_processes", "reap", "wait_until"]


def wait_until(what: str, predicate: Callable[[], object], timeout: float = 120.0,
               every: float = 0.05) -> None:
    """Return once ``predicate()`` is true; ``AssertionError`` naming ``what`` after ``timeout``
    seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def live_processes(marker: str) -> dict[int, str]:
    """pid -> command line of every live process (not a zombie, not this one) whose command line
    contains ``marker``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        cmd = raw.replace(b"\0", b" ").decode(errors="replace")
        if marker in cmd and state != "Z":
            found[int(entry.name)] = cmd
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def reap(proc: subprocess.Popen[bytes], pids: Iterable[int]) -> None:
    """Leave no process behind, whatever a test saw: ``proc`` killed and waited for if it still
    runs, and every one of ``pids`` (the processes it started) still alive SIGKILLed."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
