"""Real S3 and GCS API servers on 127.0.0.1 for tests and benchmarks, in child processes.

``S3`` is moto's server mode, ``GCS`` is gcp-storage-emulator (install ``vcasync[testkit]``). Each
binds a free port, is ready when :meth:`Emulator.start` returns, and is stopped (SIGTERM, then
SIGKILL) by :meth:`Emulator.stop` or the ``with`` block. No internet, no cloud account: S3 calls
need only dummy credentials (``DUMMY_S3_CREDENTIALS``), GCS calls none. See ``_emulator_main`` for
the two places where the emulators are made to honour conditional writes as the real services do;
``Emulator("gcs", preconditions=False)`` is the stock GCS emulator's behaviour (ignored), for tests of
what happens on a store that does not honour them.

    with Emulator("s3") as s3:
        async with open_storage(f"s3://bucket?endpoint_url={s3.endpoint}", **DUMMY_S3_CREDENTIALS): ...
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import types
from typing import IO, Literal, Self

__all__ = ["DUMMY_S3_CREDENTIALS", "Emulator"]

DUMMY_S3_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing",
                        "region": "us-east-1"}


class Emulator:
    """A storage API server in a child process. ``endpoint`` is ``http://127.0.0.1:PORT``."""

    def __init__(self, kind: Literal["s3", "gcs"], *, serialize: bool = True,
                 preconditions: bool = True, startup_timeout_s: float = 60.0) -> None:
        if kind not in ("s3", "gcs"):
            raise ValueError(f"kind must be 's3' or 'gcs', got {kind!r}")
        self.kind = kind
        self.serialize = serialize
        self.preconditions = preconditions
        self.startup_timeout_s = startup_timeout_s
        self.endpoint = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> Self:
        if self._proc is not None:
            return self
        # -P: the working directory stays off the child's sys.path, so a source checkout's vcasync/
        # folder cannot shadow the installed package (as for every vcasync child process).
        cmd = [sys.executable, "-P", "-m", "vcasync.testing._emulator_main", self.kind, "--port", "0"]
        if self.serialize and self.kind == "s3":
            cmd.append("--serialize")
        if not self.preconditions and self.kind == "gcs":
            cmd.append("--no-preconditions")
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server
        env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log,
                                      stdin=subprocess.DEVNULL, env=env)
        try:
            self.endpoint = self._await_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _await_ready(self) -> str:
        assert self._proc is not None
        assert self._proc.stdout is not None
        deadline = time.monotonic() + self.startup_timeout_s
        line = b""
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(timeout=left):
                    raise RuntimeError(f"the {self.kind} emulator did not start within "
                                       f"{self.startup_timeout_s}s:\n{self.log()}")
                data = os.read(self._proc.stdout.fileno(), 4096)  # raw: select() sees the fd
                if not data:
                    raise RuntimeError(f"the {self.kind} emulator exited with "
                                       f"{self._proc.wait()}:\n{self.log()}")
                line += data
        self._proc.stdout.close()
        word, _, endpoint = line.decode().strip().partition(" ")
        if word != "READY" or not endpoint.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"unexpected line from the {self.kind} emulator: {line!r}")
        return endpoint

    def log(self) -> str:
        """What the server wrote to stderr so far (for failure messages)."""
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if proc.stdout is not None and not proc.stdout.closed:
                proc.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: types.TracebackType | None) -> None:
        self.stop()
