"""Start a ``bench._peers`` server process and wait until it listens."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ._signals import start_process


@dataclass
class PeerExit:
    """How a peer stopped, filled in when :func:`peer` exits: ``killed`` when it was still running
    ``stop_timeout`` seconds after SIGTERM (its clean stop, a coordinator's final snapshot, did
    not happen), ``returncode`` its exit status (None while it runs)."""

    killed: bool = False
    returncode: int | None = None

    @property
    def failed(self) -> bool:
        """It did not stop cleanly on SIGTERM: killed, or a non-zero exit."""
        return self.killed or self.returncode not in (0, None)


@contextlib.contextmanager
def peer(mode: str, *args: str, timeout: float = 120.0, stop_timeout: float = 20.0,
         stopped: PeerExit | None = None) -> Iterator[str]:
    """Run ``python -m bench._peers MODE ARGS``; yields its address. At exit SIGTERM, then SIGKILL
    if it still runs ``stop_timeout`` seconds later (or when this process is interrupted while it
    waits): the peer never outlives the block. ``stopped`` is filled in with how it ended."""
    with tempfile.TemporaryDirectory(prefix="vcasync-bench-") as tmp:
        port_file = Path(tmp) / "addr"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = start_process([sys.executable, "-m", "bench._peers", mode, "--port-file",
                              str(port_file), *args], env=env)
        try:
            deadline = time.monotonic() + timeout
            while not port_file.exists() or not port_file.read_text().endswith("\n"):
                if proc.poll() is not None:
                    raise RuntimeError(f"bench peer {mode!r} exited with {proc.returncode}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"bench peer {mode!r} did not start in {timeout}s")
                time.sleep(0.05)
            yield port_file.read_text().strip()
        finally:
            outcome = stopped if stopped is not None else PeerExit()
            try:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(stop_timeout)
                    except subprocess.TimeoutExpired:
                        outcome.killed = True
            finally:   # also when the wait was interrupted (Ctrl-C, SIGTERM of this process)
                if proc.poll() is None:
                    outcome.killed = True
                    proc.kill()
                    proc.wait()
                outcome.returncode = proc.returncode
