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
from pathlib import Path


@contextlib.contextmanager
def peer(mode: str, *args: str, timeout: float = 120.0) -> Iterator[str]:
    """Run ``python -m bench._peers MODE ARGS``; yields its address; SIGTERM (then SIGKILL) at exit."""
    with tempfile.TemporaryDirectory(prefix="vcasync-bench-") as tmp:
        port_file = Path(tmp) / "addr"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "bench._peers", mode, "--port-file", str(port_file),
                                 *args], env=env)
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
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
