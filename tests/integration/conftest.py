"""Real processes on 127.0.0.1: a ``vcasync coordinator`` and ``vcasync worker``\\ s, started with the
same command a user types, killed with real signals. Every process started here is stopped at teardown
(by its own pid)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SECRET = "integration-join-secret-8c1d2e3f"
HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Procs:
    """Starts ``python -m vcasync ...`` processes with logs in files; stops them all at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, "VCASYNC_JOIN_SECRET": SECRET, "OMP_NUM_THREADS": "1",
                    "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.root / f"{name}.log").open("ab")
        proc = subprocess.Popen([sys.executable, "-m", "vcasync", "--log-level", "info", *args],
                                stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.root)
        log.close()
        self.started.append(proc)
        return proc

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        for proc in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.stop_all()
