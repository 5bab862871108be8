"""A real fleet on this machine: one ``vcasync coordinator`` process and N ``vcasync worker`` processes.

Chaos tests and benchmarks drive the same command lines a user runs, and kill them with real
signals. :class:`Fleet` starts, signals and restarts them, keeps every start's output in its own log
file under ``<run_dir>/logs/``, and gives each worker a state dir of its own (so a restarted worker
resumes what it held). The coordinator always listens on the same port so workers find it again after
a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import aiohttp

from vcasync._spawn import module_command

from . import CHAOS_COORDINATOR, harness_env

__all__ = ["Fleet", "FleetSpec", "Proc", "free_port", "process_memory", "toml_text"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the coordinator binds it again at each start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """How to start the processes. ``run_toml`` is the coordinator's ``--config``."""

    run_dir: Path
    run_toml: Path
    port: int
    join_secret: str
    trainer: str = "vcasync.examples.digits:train"
    grace_period_s: float = 5.0
    python: str = sys.executable
    log_level: str = "info"
    #: Extra environment for every process (``OMP_NUM_THREADS=1`` keeps 9 processes on 2 cores sane).
    env: Mapping[str, str] = field(default_factory=lambda: {"OMP_NUM_THREADS": "1",
                                                            "MKL_NUM_THREADS": "1"})
    #: Start the coordinator through the test-only ``harness.chaos_coordinator``, which
    #: honours the pause points and storage faults of :mod:`harness.hooks`.
    chaos_hooks: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Proc:
    """One started process: its name, start number, log file and exit status."""

    def __init__(self, name: str, start: int, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.name, self.start, self.proc, self.log = name, start, proc, log
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    def signal(self, sig: int) -> bool:
        """Send ``sig``; False when the process had already exited."""
        if not self.running:
            return False
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)
            return True
        return False

    async def wait(self, within: float | None = None) -> int | None:
        """The exit status (negative: killed by that signal), or None if still running after
        ``within`` seconds."""
        try:
            async with asyncio.timeout(within):
                return await self.proc.wait()
        except TimeoutError:
            return None


class Fleet:
    """Starts and restarts the coordinator and the workers; ``async with`` kills whatever is left."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self.logs = spec.run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.coordinator: Proc | None = None
        self.workers: dict[int, Proc] = {}
        self._starts: dict[str, int] = {}
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: types.TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """SIGKILL every process still running and reap it. Idempotent."""
        procs = [p for p in (self.coordinator, *self.workers.values()) if p is not None]
        for p in procs:
            p.signal(signal.SIGKILL)
        for p in procs:
            await p.wait(30)
        if self._http is not None:
            await self._http.close()
            self._http = None

    def state_dir(self, index: int) -> Path:
        return self.spec.run_dir / "workers" / f"w{index}"

    def worker_dirs(self) -> list[Path]:
        return sorted((self.spec.run_dir / "workers").glob("w*"))

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        return {**os.environ, **self.spec.env, "VCASYNC_JOIN_SECRET": self.spec.join_secret,
                **(extra or {})}

    async def _spawn(self, name: str, args: Sequence[str], env: Mapping[str, str] | None,
                     module: str = "vcasync") -> Proc:
        n = self._starts[name] = self._starts.get(name, 0) + 1
        log = self.logs / f"{name}-{n:03d}.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *module_command(module, "--log-level", self.spec.log_level, *args,
                                python=self.spec.python),
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
                env=harness_env(self._env(env)), cwd=self.spec.run_dir)
        return Proc(name, n, proc, log)

    # -- coordinator ------------------------------------------------------------------------------
    async def start_coordinator(self, env: Mapping[str, str] | None = None,
                                within: float = 120.0) -> Proc:
        """Start the coordinator and wait until ``/healthz`` answers or the process exits (a crash
        while recovering, or a run that was already finished: the caller looks at the status)."""
        proc = await self.spawn_coordinator(env)
        await self.wait_ready(proc, within)
        return proc

    async def spawn_coordinator(self, env: Mapping[str, str] | None = None) -> Proc:
        """Start the coordinator process and return at once."""
        if self.coordinator is not None and self.coordinator.running:
            raise RuntimeError("the coordinator is already running")
        module = CHAOS_COORDINATOR if self.spec.chaos_hooks else "vcasync"
        proc = await self._spawn("coordinator", ["coordinator", "--config", str(self.spec.run_toml),
                                                 "--port", str(self.spec.port)], env, module)
        self.coordinator = proc
        return proc

    async def wait_ready(self, proc: Proc, within: float = 120.0) -> None:
        """Until ``proc`` answers ``/healthz`` or exits; RuntimeError after ``within`` seconds."""
        deadline = time.monotonic() + within
        while proc.running and await self.health() is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the coordinator did not answer in {within}s; see {proc.log}")
            await asyncio.sleep(0.1)

    async def health(self) -> dict[str, object] | None:
        """``GET /healthz`` of the coordinator, or None while it is down."""
        assert self._http is not None, "use the Fleet inside async with"
        try:
            async with self._http.get(f"{self.spec.url}/healthz") as resp:
                if resp.status != 200:
                    return None
                body = await resp.json()
                return body if isinstance(body, dict) else None
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None

    # -- workers ----------------------------------------------------------------------------------
    async def start_worker(self, index: int, *, on_preempt: str = "checkpoint",
                           extra: Sequence[str] = ()) -> Proc:
        if index in self.workers and self.workers[index].running:
            raise RuntimeError(f"worker {index} is already running")
        state = self.state_dir(index)
        state.mkdir(parents=True, exist_ok=True)
        proc = await self._spawn(f"w{index}", [
            "worker", "--coordinator", self.spec.url, "--trainer", self.spec.trainer,
            "--state-dir", str(state), "--name", f"w{index}", "--threads", "1",
            "--grace-period", str(self.spec.grace_period_s), "--on-preempt", on_preempt, *extra], None)
        self.workers[index] = proc
        return proc

    def running_workers(self) -> list[int]:
        return [i for i, p in self.workers.items() if p.running]

    def log_files(self) -> list[Path]:
        return sorted(self.logs.glob("*.log"))


def toml_text(table: Mapping[str, object], _path: str = "") -> str:
    """A TOML document for nested tables of str / int / float / bool / lists of those (run.toml)."""
    scalars: list[str] = []
    tables: list[str] = []
    for key, value in table.items():
        if isinstance(value, Mapping):
            name = f"{_path}.{key}" if _path else key
            tables.append(f"\n[{name}]\n" + toml_text(value, name))
        else:
            scalars.append(f"{key} = {_toml_value(value)}\n")
    return "".join(scalars) + "".join(tables)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def process_memory(pid: int) -> dict[str, int]:
    """``{"rss": ..., "peak": ...}`` in bytes from ``/proc/<pid>/status`` (VmRSS, VmHWM); Linux."""
    out: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out["rss" if key == "VmRSS" else "peak"] = int(rest.split()[0]) * 1024
    return out
