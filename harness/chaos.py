"""A chaos run: a real fleet trains the digits example while its processes are killed and its storage
misbehaves; then :mod:`harness.audit` checks what survived.

One coordinator and ``workers`` ``vcasync worker`` processes (half preempt with a checkpoint, half
with a partial result). The coordinator runs through the test-only entry point
:mod:`harness.chaos_coordinator` (the ``vcasync coordinator`` command plus the hooks below;
the production command ignores them). While they train:

- workers get SIGTERM (a preemption notice, ``grace_period_s`` to wrap up; escalated to SIGKILL if
  they overrun) or SIGKILL at random moments, ``kill_interval_s`` apart on average, and come back
  after a random delay with the same state dir;
- the coordinator gets SIGKILLed ``len(coordinator_kills)`` times, spread over the run, each at a
  chosen kind of moment: ``"merge"`` (inside the merge policy, after the journal write and before
  the acknowledgement), ``"snapshot"`` (a snapshot's data written, its manifest not yet),
  ``"journal"`` (a journal entry just written), ``"upload"`` (while a result upload, sent by this
  driver as a worker would, is half received), ``"random"``; the first three are reached through
  the pause points of :mod:`harness.hooks` and verified by their marker files;
- the coordinator's storage fails and slows calls (``storage_faults``, see ``hooks``).

:func:`run_chaos` returns what it did and saw (:class:`ChaosResult`), including the audit.
``undisturbed()`` gives the same run with no kills and no faults: the reference for accuracy.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vcasync.ledger._units import Receipt
from vcasync.worker._state_dir import StateDir

from .audit import AuditReport
from .chaos_driver import DriverWorker, audit_run, one_torch_thread
from .fleet import Fleet, FleetSpec, Proc, free_port, toml_text
from .hooks import PausePlan, marker_path

__all__ = ["DEFAULT_FAULTS", "JOIN_SECRET", "PAUSE_KINDS", "ChaosConfig", "ChaosResult", "run_chaos"]

#: Writes fail 3 % of the time (1 % after they happened), a fifth of all calls wait up to 50 ms.
DEFAULT_FAULTS = "fail=0.02,lose_reply=0.01,ops=put+put_stream+delete;delay=0.2,max_delay_s=0.05"
PAUSE_KINDS = ("merge", "snapshot", "journal")
JOIN_SECRET = "chaos-join-secret-0123456789abcdef"


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    """The run and the chaos. The defaults are the long run; tests shrink them."""

    workers: int = 8
    worker_kills: int = 100
    sigkill_share: float = 0.5
    coordinator_kills: tuple[str, ...] = ("merge", "snapshot", "upload", "journal", "random")
    shards: int = 8
    epochs: int = 8
    steps: int = 40
    unit_params: Mapping[str, Any] = field(default_factory=lambda: {"lr": 0.05, "checkpoint_every": 5})
    policy: Mapping[str, Any] = field(default_factory=lambda: {"name": "vcasgd"})
    lease_timeout_s: float = 10.0
    grace_period_s: float = 3.0
    snapshot_every: int = 8
    storage_faults: str = DEFAULT_FAULTS
    kill_interval_s: float = 1.0
    restart_delay_s: tuple[float, float] = (0.3, 2.0)
    coordinator_restart_delay_s: float = 0.5
    seed: int = 0
    timeout_s: float = 1200.0
    linger_s: float = 3.0
    model: str = "vcasync.examples.digits:model"
    trainer: str = "vcasync.examples.digits:train"

    @property
    def units_total(self) -> int:
        return self.shards * self.epochs

    def undisturbed(self) -> ChaosConfig:
        """The same run without kills or faults."""
        return replace(self, worker_kills=0, coordinator_kills=(), storage_faults="")

    def run_table(self, store_url: str, output: Path) -> dict[str, Any]:
        """The coordinator's run.toml for this run."""
        return {
            "model": {"factory": self.model, "seed": self.seed},
            "units": {"shards": self.shards, "epochs": self.epochs, "steps": self.steps,
                      "params": dict(self.unit_params)},
            "policy": dict(self.policy),
            "storage": {"url": store_url},
            # Every snapshot and journal entry is kept so the audit can read the whole history;
            # units never park (a unit may be killed many times).
            "coordinator": {"durability": "journal", "lease_timeout_s": self.lease_timeout_s,
                            "snapshot_every": self.snapshot_every, "snapshot_interval_s": 5.0,
                            "keep_snapshots": 100_000, "prune_on_close": False,
                            "max_attempts": 10_000,
                            "expiry_interval_s": 0.5},
            "server": {"host": "127.0.0.1"},
            "run": {"linger_s": self.linger_s, "output": str(output)},
        }


@dataclass(slots=True)
class ChaosResult:
    """What the driver did and observed, and the audit of the durable state."""

    seconds: float = 0.0
    finished: bool = False
    worker_kills: Counter[str] = field(default_factory=Counter)
    sigterm_clean_exits: int = 0
    worker_restarts: int = 0
    worker_crashes: list[str] = field(default_factory=list)
    coordinator_kills: list[dict[str, Any]] = field(default_factory=list)
    coordinator_starts: int = 0
    coordinator_crashes: list[int] = field(default_factory=list)
    observed: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    audit: AuditReport | None = None

    @property
    def total_worker_kills(self) -> int:
        return self.worker_kills["sigterm"] + self.worker_kills["sigkill"]

    def as_dict(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 1), "finished": self.finished,
                "worker_kills": self.total_worker_kills, "worker_kills_by_signal": dict(self.worker_kills),
                "sigterm_clean_exits": self.sigterm_clean_exits, "worker_restarts": self.worker_restarts,
                "worker_crashes": self.worker_crashes[:20],
                "coordinator_kills": len(self.coordinator_kills),
                "coordinator_kill_moments": self.coordinator_kills,
                "coordinator_starts": self.coordinator_starts,
                "coordinator_crashes": len(self.coordinator_crashes),
                "versions_observed": len(self.observed), "notes": self.notes[-20:],
                "audit": None if self.audit is None else self.audit.as_dict()}


class _Run:
    def __init__(self, cfg: ChaosConfig, run_dir: Path, fleet: Fleet) -> None:
        self.cfg, self.dir, self.fleet = cfg, run_dir, fleet
        self.rng = random.Random(cfg.seed)
        self.res = ChaosResult()
        self.done = asyncio.Event()
        self.version = 0
        self.killed: set[Proc] = set()
        self.pending = list(cfg.coordinator_kills)
        self.markers = run_dir / "markers"
        self.markers.mkdir(parents=True, exist_ok=True)
        self.driver = DriverWorker(fleet.spec.url, JOIN_SECRET, run_dir / "driver", cfg)
        self.plan_for: dict[int, tuple[str, int]] = {}   # coordinator pid -> (pause kind, target)
        self.lead = max(2, cfg.units_total // 8)        # versions ahead to prepare the upload
        self.started = time.monotonic()

    # -- progress ---------------------------------------------------------------------------------
    def target_version(self, n: int) -> int:
        """Where kill ``n`` of the coordinator should happen: spread over 10 %..70 % of the run."""
        k = len(self.cfg.coordinator_kills)
        frac = 0.1 + 0.6 * (n + 0.5) / max(1, k)
        return max(1, int(frac * self.cfg.units_total))

    async def monitor(self) -> None:
        while not self.done.is_set():
            health = await self.fleet.health()
            v = health.get("version") if health is not None else None
            if isinstance(v, int):
                if not self.res.observed or v != self.res.observed[-1]:
                    self.res.observed.append(v)
                self.version = max(self.version, v)
            await _sleep_or(self.done, 0.2)

    # -- the coordinator ------------------------------------------------------------------------------
    def _next_env(self) -> dict[str, str]:
        if not self.pending or self.pending[0] not in PAUSE_KINDS:
            return {}
        kind = self.pending[0]
        ahead = max(1, self.target_version(len(self.res.coordinator_kills)) - self.version)
        n = ahead if kind != "snapshot" else 3 * max(0, ahead // self.cfg.snapshot_every) + 1
        return PausePlan({kind: n}, self.markers).env()

    async def start_coordinator(self) -> Proc:
        env = self._next_env()
        if self.cfg.storage_faults:
            env["VCASYNC_STORAGE_FAULTS"] = self.cfg.storage_faults
        proc = await self.fleet.spawn_coordinator(env)
        self.res.coordinator_starts += 1
        if "VCASYNC_PAUSE_AT" in env:   # known before it starts: it may pause while it recovers
            kind, _, n = env["VCASYNC_PAUSE_AT"].partition("@")
            self.plan_for[proc.pid] = (kind, int(n))
        await self.fleet.wait_ready(proc)
        return proc

    async def keep_coordinator(self) -> None:
        """Restart the coordinator whenever it dies, until it exits 0 (the run finished)."""
        while True:
            proc = self.fleet.coordinator
            assert proc is not None
            rc = await proc.wait()
            if proc not in self.killed:
                if rc == 0:
                    self.res.finished = True
                    self.done.set()
                    return
                # e.g. a storage fault while it recovered: it exits, and comes back
                self.res.coordinator_crashes.append(int(rc or 0))
                self.res.notes.append(f"coordinator exited with {rc}: {_last_line(proc.log)}")
            await asyncio.sleep(self.cfg.coordinator_restart_delay_s)
            await self.start_coordinator()

    async def kill_coordinator(self, kind: str, **extra: Any) -> None:
        proc = self.fleet.coordinator
        assert proc is not None
        self.killed.add(proc)
        proc.signal(signal.SIGKILL)
        await proc.wait()
        self.res.coordinator_kills.append({"kind": kind, "version": self.version, **extra})

    async def coordinator_chaos(self) -> None:
        while self.pending and not self.done.is_set():
            kind = self.pending[0]
            n = len(self.res.coordinator_kills)
            if kind in PAUSE_KINDS:
                proc = self.fleet.coordinator
                if proc is None or proc.pid not in self.plan_for or not proc.running:
                    await _sleep_or(self.done, 0.1)
                    continue
                marker = marker_path(self.markers, kind, proc.pid)
                if not marker.exists():
                    await _sleep_or(self.done, 0.05)
                    continue
                self.pending.pop(0)
                await self.kill_coordinator(kind, verified=True, occurrence=self.plan_for[proc.pid][1])
                continue
            # The upload kill's moment is the driver's result, trained from ``lead`` versions before
            # the target on and sent as soon as it is ready: held back until the target, its
            # lease (which heartbeats without progress do not extend) ran out, another worker
            # did its unit, the upload was refused at once, and with every unit leased the
            # driver found no other: the upload, journal and random kills never came.
            ready = (kind == "upload" and self.version >= self.target_version(n) - self.lead
                     and await self.driver.prepare())
            if self.version < self.target_version(n) and not ready:
                await _sleep_or(self.done, 0.1)
                continue
            if kind == "upload":
                up = await self.fleet.health()
                sent = await self.driver.start_slow_upload() if up else None
                proc = self.fleet.coordinator
                if sent is None or proc is None or not proc.running:
                    why = self.driver.last_error if up else "the coordinator is not up"
                    self.res.notes.append(f"upload kill postponed at version {self.version} "
                                          f"(target {self.target_version(n)}): {why}")
                    self.driver.abandon_upload()      # not mid-upload: try again in a moment
                    await _sleep_or(self.done, self.driver.retry_in)
                    continue
                self.pending.pop(0)
                await self.kill_coordinator(kind, verified=True, bytes_sent=sent)
                self.driver.upload_cut()              # the result is re-sent after the restart
            else:
                self.pending.pop(0)
                await self.kill_coordinator(kind, verified=True)

    # -- workers ----------------------------------------------------------------------------------
    def on_preempt(self, i: int) -> str:
        return "partial" if i % 2 else "checkpoint"

    async def keep_worker(self, i: int) -> None:
        while not self.done.is_set():
            proc = self.fleet.workers[i]
            rc = await proc.wait()
            if proc in self.killed:
                delay = self.rng.uniform(*self.cfg.restart_delay_s)
            elif rc == 0:
                return                      # the run is finished for this worker
            else:
                self.res.worker_crashes.append(f"w{i} start {proc.start} exited {rc}; see {proc.log}")
                delay = 1.0
            if await _sleep_or(self.done, delay):
                return
            await self.fleet.start_worker(i, on_preempt=self.on_preempt(i))
            self.res.worker_restarts += 1

    def kill_gap(self) -> float:
        """Mean seconds to the next worker kill: ``kill_interval_s``, or less when the run goes so
        fast that the kills left would not fit before 70 % of it (the machine's speed varies)."""
        cfg = self.cfg
        elapsed = time.monotonic() - self.started
        if self.version < 2 or elapsed <= 0:
            return cfg.kill_interval_s
        rate = self.version / elapsed
        remaining_s = max(0.0, 0.7 * cfg.units_total - self.version) / rate
        left = max(1, cfg.worker_kills - self.res.total_worker_kills)
        return max(0.2, min(cfg.kill_interval_s, remaining_s / left))

    async def worker_chaos(self) -> None:
        cfg = self.cfg
        async with asyncio.TaskGroup() as preemptions:
            while self.res.total_worker_kills < cfg.worker_kills and not self.done.is_set():
                if await _sleep_or(self.done, self.rng.expovariate(1.0 / self.kill_gap())):
                    return
                self.kill_one_worker(preemptions)

    def kill_one_worker(self, preemptions: asyncio.TaskGroup) -> None:
        """SIGKILL, or SIGTERM (whose grace period runs in ``preemptions``), a random worker."""
        cfg = self.cfg
        # Mostly workers past their imports (they have logged), sometimes one still booting.
        booting = self.rng.random() < 0.1
        ready = [i for i, p in self.fleet.workers.items()
                 if p.running and p not in self.killed and (booting or _logged(p))]
        if not ready:
            return
        proc = self.fleet.workers[self.rng.choice(ready)]
        self.killed.add(proc)
        n = self.res.total_worker_kills   # the first two are one of each, then at random
        if (n == 1) if n < 2 else self.rng.random() < cfg.sigkill_share:
            proc.signal(signal.SIGKILL)
            self.res.worker_kills["sigkill"] += 1
            return
        proc.signal(signal.SIGTERM)
        self.res.worker_kills["sigterm"] += 1
        preemptions.create_task(self.grace(proc))

    async def grace(self, proc: Proc) -> None:
        """A preempted worker has ``grace_period_s`` to save and exit; past it, SIGKILL."""
        rc = await proc.wait(self.cfg.grace_period_s + 10.0)
        if rc is None:
            proc.signal(signal.SIGKILL)
            self.res.worker_kills["escalated"] += 1
        elif rc == 0:
            self.res.sigterm_clean_exits += 1

    async def after_upload_kill(self) -> None:
        """Deliver the result whose upload the coordinator kill cut, as a worker would (and only
        that one: a result still waiting for its slow upload is not delivered)."""
        while not self.done.is_set():
            await self.driver.finish_upload()
            await _sleep_or(self.done, 0.5)

    async def stop_workers(self) -> None:
        """After the run: the workers heard "finished" during the linger; stop any that did not."""
        for p in self.fleet.workers.values():
            if await p.wait(30.0) is None:
                self.killed.add(p)
                p.signal(signal.SIGKILL)


def _last_line(log: Path) -> str:
    """The last line a process wrote that is not an access log line (why it stopped)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    own = [ln for ln in lines if ln.strip() and "aiohttp.access" not in ln]
    return own[-1][:300] if own else "(empty log)"


def _logged(p: Proc) -> bool:
    try:
        return p.log.stat().st_size > 0
    except OSError:
        return False


async def _sleep_or(event: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds``, or less if ``event`` is set; True when it is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
    return event.is_set()


async def run_chaos(cfg: ChaosConfig, run_dir: Path, *, audit: bool = True) -> ChaosResult:
    """Run the fleet under ``cfg``'s chaos in ``run_dir`` (created), then audit its storage."""
    with one_torch_thread():    # this process trains the driver's unit and audits
        return await _run_chaos(cfg, run_dir, audit)


async def _run_chaos(cfg: ChaosConfig, run_dir: Path, audit: bool) -> ChaosResult:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    store = run_dir / "store"
    toml = run_dir / "run.toml"
    toml.write_text(toml_text(cfg.run_table(f"file://{store}", run_dir / "final.pt")))
    spec = FleetSpec(run_dir=run_dir, run_toml=toml, port=free_port(), join_secret=JOIN_SECRET,
                     trainer=cfg.trainer, grace_period_s=cfg.grace_period_s, chaos_hooks=True)
    started = time.monotonic()
    async with Fleet(spec) as fleet:
        run = _Run(cfg, run_dir, fleet)
        try:
            async with asyncio.timeout(cfg.timeout_s):
                await run.start_coordinator()
                for i in range(cfg.workers):
                    await fleet.start_worker(i, on_preempt=run.on_preempt(i))
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(run.monitor())
                    tg.create_task(run.keep_coordinator())
                    for i in range(cfg.workers):
                        tg.create_task(run.keep_worker(i))
                    tg.create_task(run.worker_chaos())
                    tg.create_task(run.coordinator_chaos())
                    tg.create_task(run.after_upload_kill())
                    if "upload" in cfg.coordinator_kills:
                        tg.create_task(run.driver.warm_up())
                    await run.done.wait()
                    await run.stop_workers()
        except TimeoutError:
            run.res.finished = False
        finally:
            run.done.set()
            await run.driver.aclose()
    res = run.res
    res.seconds = time.monotonic() - started
    if audit:
        receipts: dict[str, list[Receipt]] = {d.name: StateDir(d).receipts() for d in fleet.worker_dirs()}
        receipts["driver"] = list(run.driver.receipts)
        res.audit = await audit_run(cfg, f"file://{store}", receipts, res.observed)
    return res
