"""The demo run: a coordinator process, N worker processes, a spot market that preempts them.

:func:`run_demo` starts ``vcasync coordinator`` on 127.0.0.1 (journal durability on local disk in the run
directory, or ``storage``), then one ``vcasync worker`` process per slot. The spot market
(:mod:`vcasync.demo.market`) preempts ``preemptions`` of them over the run (or, with
``preempt_per_min``, at a rate): SIGTERM (the notice: the worker checkpoints and exits within its grace
period) or, for ``kill_fraction`` of them, SIGKILL; the slot comes back after a random delay with its
state dir, as capacity returns. With
``kill_coordinator`` the coordinator is SIGKILLed once, when about 40 % of the units are done, and
restarted on the same port and storage. When every worker has heard that the run is finished, the
final model is scored; the caller then runs the DDP baseline (:mod:`vcasync.demo.ddp`) with the
same number of processes on the same samples, and :mod:`vcasync.demo.report` writes ``report.json``
and the plots.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import re
import secrets
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._paths import make_output_dir
from ..coerce import SEED_RANGE, is_finite_number, is_seed
from ..costing.market import SpotTrace, SpotWalk
from ..costing.prices import DEFAULT_COORDINATOR_INSTANCE, DEFAULT_INSTANCE, PriceTable
from ..errors import ConfigError, PolicyError
from ..storage import open_storage, outlives_process
from .ddp import DdpConfig
from .limits import (
    MAX_DELAY_S,
    MAX_EPOCHS,
    MAX_PREEMPT_PER_MIN,
    MAX_PREEMPTIONS,
    MAX_STEPS,
    MAX_WALL_S,
    MAX_WORKERS,
)
from .market import SpotMarket
from .procs import Proc, Slot, Timeline

__all__ = ["BASE_LR", "DemoConfig", "DemoRun", "run_demo"]

#: The digits workload's per-worker SGD learning rate (each workload has its own, ``Workload.lr``),
#: which the defaults scale by sqrt(workers).
BASE_LR = 0.05



#: The least time the DDP baseline is given: a short ``max_wall_s`` bounds the fleet, and the
#: report of a fleet stopped early still needs its comparison (DDP's start-up alone takes seconds).
DDP_MIN_WALL_S = 120.0

#: Crashes (exits on an error, not a preemption) a slot restarts after; the next one ends the slot.
MAX_CRASHES = 3


@dataclass(frozen=True)
class DemoConfig:
    """Everything about one demo run (the CLI fills it from flags)."""

    workers: int = 4
    workload: str = "digits"
    policy: str = "vcasgd"
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    epochs: int = 20
    shards: int | None = None
    steps: int | None = None
    batch_size: int = 32
    lr: float | None = None
    sync_lr: float | None = None
    momentum: float = 0.9
    min_step_s: float = 0.0
    preemptions: int = 4
    preempt_per_min: float = 0.0
    kill_fraction: float = 0.25
    restart_delay_s: tuple[float, float] = (1.0, 4.0)
    grace_s: float = 5.0
    lease_timeout_s: float = 10.0
    kill_coordinator: bool = False
    run_dir: Path | None = None
    storage: str | None = None
    durability: str = "journal"
    instance: str = DEFAULT_INSTANCE
    coordinator_instance: str = DEFAULT_COORDINATOR_INSTANCE
    prices: PriceTable = field(default_factory=PriceTable)
    #: the workers' spot price over the run (a trace or a walk); None: the table's fixed spot rate
    spot_path: SpotTrace | SpotWalk | None = None
    seed: int = 0
    eval_every_s: float = 3.0
    max_wall_s: float = 900.0
    progress: bool = True

    def __post_init__(self) -> None:
        def seconds(value: float, top: float, *, strict: bool) -> bool:
            """A finite number of seconds, > 0 (``strict``) or >= 0, at most ``top``."""
            return is_finite_number(value, 0, strict=strict, high=top)

        lo, hi = self.restart_delay_s
        checks = [
            (1 <= self.workers <= MAX_WORKERS,
             f"workers (--workers) must be 1 to {MAX_WORKERS} (each is a process importing torch, on "
             f"this one machine), got {self.workers}"),
            (1 <= self.epochs <= MAX_EPOCHS,
             f"epochs (--epochs) must be 1 to {MAX_EPOCHS}, got {self.epochs}"),
            (self.shards is None or self.shards >= 1,
             f"shards (--shards) must be >= 1 (and at most the data set's training samples), "
             f"got {self.shards}"),
            (self.steps is None or 1 <= self.steps <= MAX_STEPS,
             f"steps (--steps) must be 1 to {MAX_STEPS} local steps per unit, got {self.steps}"),
            (self.batch_size >= 1, f"batch_size (--batch-size) must be >= 1, got {self.batch_size}"),
            (seconds(self.min_step_s, MAX_DELAY_S, strict=False),
             f"min_step_s (--min-step-s) must be a finite number of seconds from 0 to {MAX_DELAY_S:g}, "
             f"got {self.min_step_s}"),
            (self.lr is None or (is_finite_number(self.lr) and self.lr > 0),
             f"lr (--lr) must be a finite number > 0, got {self.lr}"),
            (self.sync_lr is None or (is_finite_number(self.sync_lr) and self.sync_lr > 0),
             f"sync_lr (--sync-lr) must be a finite number > 0, got {self.sync_lr}"),
            (is_finite_number(self.momentum) and 0 <= self.momentum < 1,
             f"momentum must be in [0, 1), got {self.momentum}"),
            (is_finite_number(self.preempt_per_min) and 0 <= self.preempt_per_min <= MAX_PREEMPT_PER_MIN,
             f"preempt_per_min (--preempt-per-min) must be a finite rate from 0 to "
             f"{MAX_PREEMPT_PER_MIN:g} per minute, got {self.preempt_per_min}"),
            (0 <= self.kill_fraction <= 1,
             f"kill_fraction (--kill-fraction) must be in [0, 1], got {self.kill_fraction}"),
            (0 <= self.preemptions <= MAX_PREEMPTIONS,
             f"preemptions (--preemptions) must be 0 to {MAX_PREEMPTIONS}, got {self.preemptions}"),
            (is_seed(self.seed), f"seed (--seed) must be in {SEED_RANGE}, got {self.seed}"),
            (seconds(lo, MAX_DELAY_S, strict=False) and seconds(hi, MAX_DELAY_S, strict=False) and lo <= hi,
             f"restart delay (--restart-delay) must be finite seconds 0 <= min <= max <= {MAX_DELAY_S:g}, "
             f"got {self.restart_delay_s}"),
            (seconds(self.grace_s, MAX_DELAY_S, strict=True),
             f"grace_s (--grace) must be a finite number of seconds > 0 and <= {MAX_DELAY_S:g}, "
             f"got {self.grace_s}"),
            (seconds(self.lease_timeout_s, MAX_DELAY_S, strict=True),
             f"lease_timeout_s must be a finite number of seconds > 0 and <= {MAX_DELAY_S:g}, "
             f"got {self.lease_timeout_s}"),
            (seconds(self.max_wall_s, MAX_WALL_S, strict=True),
             f"max_wall_s (--max-wall) must be a finite number of seconds > 0 and <= {MAX_WALL_S:g} "
             f"(a week), got {self.max_wall_s}"),
            (seconds(self.eval_every_s, MAX_DELAY_S, strict=True),
             f"eval_every_s must be a finite number of seconds > 0 and <= {MAX_DELAY_S:g}, "
             f"got {self.eval_every_s}"),
            (self.durability in ("journal", "snapshot", "none"),
             f"durability (--durability) must be journal, snapshot or none, got {self.durability!r}"),
            (not (self.kill_coordinator and self.durability == "none"),
             "kill_coordinator (--kill-coordinator) needs durable state: durability journal or snapshot"),
            # memory:// lives in the coordinator's process: restarted on it, the run started over
            # from a fresh model, ended at chance accuracy, and the report said "all recovered"
            (not (self.kill_coordinator and self.storage is not None and not outlives_process(self.storage)),
             f"kill_coordinator (--kill-coordinator) needs storage that outlives the coordinator "
             f"process; {self.storage} is gone when it exits: use a path, file://, s3:// or gs://"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        from ..examples.workloads import WORKLOADS

        if self.workload not in WORKLOADS:
            raise ConfigError(f"unknown workload {self.workload!r}; choose one of {sorted(WORKLOADS)}")
        self.prices.resolve(self.instance)
        self.prices.resolve(self.coordinator_instance)
        # the policy and its parameters, built here as the coordinator will build them: refused
        # there, the demo said only "the coordinator exited at start" and left its run directory
        # behind (a re-run with the same --run-dir was then refused as not empty)
        from ..policy import build_policy

        try:
            build_policy(self.policy, self.policy_params)
        except PolicyError as exc:  # an unknown name, a plugin that fails validation
            raise ConfigError(f"policy {self.policy!r}: {exc}") from None

    @property
    def worker_lr(self) -> float:
        """The workers' learning rate: ``lr``, or the workload's rate x sqrt(workers) (see below)."""
        return self.lr if self.lr is not None else self._sqrt_rule()

    @property
    def baseline_lr(self) -> float:
        """The synchronous baseline's learning rate: ``sync_lr``, or the workload's rate x sqrt(workers).

        Both default to the square-root rule, a documented default for a run without a learning-rate
        search: synchronous SGD steps on a ``workers``-times larger batch, and VC-ASGD with
        ``workers`` results in flight advances by about one worker's progress per ``workers`` merges,
        a large-batch method too. ``bench/convergence.py`` searches both rates instead, with the same
        budget on both sides, chosen on the validation split.
        """
        return self.sync_lr if self.sync_lr is not None else self._sqrt_rule()

    def _sqrt_rule(self) -> float:
        from ..examples.workloads import get_workload

        return get_workload(self.workload).lr * math.sqrt(self.workers)

    def num_shards(self) -> int:
        return self.shards if self.shards is not None else 2 * self.workers

    def check_data(self, samples: int) -> None:
        """Refuse a configuration the workload's ``samples`` training samples cannot hold: more
        shards than samples left shards empty (``--shards 100000`` on 1,293 images was accepted)."""
        if self.num_shards() > samples:
            flag = "--shards" if self.shards is not None else "--workers (2 shards each by default)"
            raise ConfigError(f"shards must be at most the {self.workload} workload's {samples} training "
                              f"samples, got {self.num_shards()}: lower {flag}")

    def ddp_config(self, samples: int) -> DdpConfig:
        """The DDP baseline this run is compared with: as many processes on the same ``samples``,
        batch size, momentum, seed and step pace (``min_step_s``), at :attr:`baseline_lr`."""
        return DdpConfig(workers=self.workers, workload=self.workload, batch_size=self.batch_size,
                         samples=samples, lr=self.baseline_lr, momentum=self.momentum, seed=self.seed,
                         timeout_s=max(self.max_wall_s, DDP_MIN_WALL_S), min_step_s=self.min_step_s)


@dataclass(slots=True)
class DemoRun:
    """What a run leaves for the report."""

    config: DemoConfig
    run_dir: Path
    timeline: Timeline
    slots: list[Slot]
    total_units: int
    unit_steps: int
    wall_s: float = 0.0
    finished: bool = False
    coordinator_restarts: int = 0
    final: dict[str, Any] = field(default_factory=dict)
    accuracy: list[tuple[float, int, int | None, float, float]] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    versions: list[tuple[float, int]] = field(default_factory=list)
    coordinator_cpu: list[tuple[int, float]] = field(default_factory=list)
    #: the monitor's scoring instants (run clock; :attr:`Monitor.scored_s`)
    scored_s: list[float] = field(default_factory=list)
    #: the spot market's :meth:`~vcasync.demo.market.SpotMarket.stats`: preemptions asked and fired
    market: dict[str, Any] = field(default_factory=dict)
    #: when ``max_wall_s`` stopped the fleet (run clock), None when it did not: the curve, the
    #: versions and so the time to target stop there; sessions are billed until each process stopped
    limit_s: float | None = None
    #: model versions merged after the limit fired (workers in their grace period): not counted
    merged_after_limit: int = 0
    #: when the last worker stopped after the limit fired (run clock), None without a limit: the
    #: fleet's sessions run until then, past the limit by up to the workers' grace period
    workers_stopped_s: float | None = None
    #: why an unfinished run did not finish (None when it finished), for the exit message
    incomplete_reason: str | None = None

    def curve(self) -> list[tuple[float, int, int | None, float, float]]:
        """The scores the fleet's figures count (the curve, the time to target): every one, or with
        a limit those of the model as it stood at the limit (stamped at or before it)."""
        if self.limit_s is None:
            return list(self.accuracy)
        return [p for p in self.accuracy if p[0] <= self.limit_s]

    def scored_after_limit(self) -> list[tuple[float, int, int | None, float, float]]:
        """Scores of models that existed only after the limit: the coordinator could not be reached
        when the limit fired, so the model was scored once it answered again, after the workers
        were stopped, with what they merged meanwhile. Kept out of :meth:`curve`; when nothing was
        scored before, the last of them is the run's final score, marked as taken after the limit."""
        if self.limit_s is None:
            return []
        limit = self.limit_s
        return [p for p in self.accuracy if p[0] > limit]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fresh_run_dir(base: Path) -> Path:
    make_output_dir(base, "the default run directory", purpose="or name one with --run-dir")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        d = base / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            d.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            raise ConfigError(f"cannot create the run directory {d}: {exc.strerror or exc}; "
                              f"name one with --run-dir") from None
        return d
    raise ConfigError(f"cannot create a fresh run directory under {base}")


def _check_empty(run_dir: Path) -> None:
    """A demo run needs a directory of its own: in one that holds an earlier run, the coordinator
    found that run finished and exited at once, and the demo said only "exited at start"."""
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        what = "is not a directory" if not run_dir.is_dir() else "is not empty"
        earlier = " (it holds an earlier demo run)" if (run_dir / "state").exists() else ""
        raise ConfigError(f"--run-dir {run_dir} {what}{earlier}: each demo run needs a fresh "
                          f"directory; name another, or leave --run-dir out for ./runs/<time>")


async def _check_fresh_storage(url: str) -> None:
    """The demo's coordinator starts a run of its own: on a store that holds one already it
    resumes that (a finished one ends at once, and the demo said only "exited at start")."""
    async with open_storage(url) as storage:
        async for key in storage.list(""):
            raise ConfigError(f"--storage {url} is not empty (it holds {key!r}, perhaps an earlier "
                              f"run, which the coordinator would resume): name an empty store")


def _toml(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


class _Demo:
    def __init__(self, cfg: DemoConfig, data_train: int, model_ref: str) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        if cfg.run_dir is not None:
            _check_empty(cfg.run_dir)
            # a path that cannot be made (under /proc, below a file) is named here, before anything
            # starts: it was a FileNotFoundError or NotADirectoryError traceback
            make_output_dir(cfg.run_dir, "--run-dir", purpose="where state, logs and the report go")
        self.run_dir = cfg.run_dir if cfg.run_dir is not None else _fresh_run_dir(Path("runs"))
        for sub in ("logs", "events", "workers", "scratch"):
            (self.run_dir / sub).mkdir(exist_ok=True)
        shards = cfg.num_shards()
        self.unit_steps = cfg.steps or max(1, math.ceil(data_train / shards / cfg.batch_size))
        self.total_units = shards * cfg.epochs
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.secret = secrets.token_urlsafe(24)
        self.timeline = Timeline()
        self.stop_injecting = asyncio.Event()
        self.coordinator_restarts = 0
        self.restarting = False      # the coordinator was SIGKILLed and is being brought back
        self.found_finished = False  # ... and its restart found the run finished: nothing to serve
        #: how the coordinator exited on its own before the run finished (a crash, a kill from
        #: outside), said in the report; None while it is up or was stopped by the demo
        self.coordinator_lost: str | None = None
        #: where the coordinator writes the final weights when the run finishes (``--output``)
        self.final_weights = (self.run_dir / "final.pt").resolve()
        env = {"VCASYNC_JOIN_SECRET": self.secret, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        storage = cfg.storage or (self.run_dir / "state").resolve().as_uri()
        params = {"workload": cfg.workload, "lr": cfg.worker_lr, "batch_size": cfg.batch_size,
                  "momentum": cfg.momentum, "min_step_s": cfg.min_step_s,
                  "events_dir": str((self.run_dir / "events").resolve())}
        model = model_ref
        args = ["coordinator", "--model", model, "--seed", str(cfg.seed),
                "--shards", str(shards), "--epochs", str(cfg.epochs), "--steps", str(self.unit_steps),
                "--policy", cfg.policy, "--storage", storage, "--durability", cfg.durability,
                "--lease-timeout", str(cfg.lease_timeout_s), "--host", "127.0.0.1", "--port", str(self.port),
                "--linger", "600", "--output", str(self.final_weights)]
        for k, v in params.items():
            args += ["--unit-param", f"{k}={_toml(v)}"]
        for k, v in cfg.policy_params.items():
            args += ["--policy-param", f"{k}={_toml(v)}"]
        logs = self.run_dir / "logs"
        self.coordinator = Proc("coordinator", args, env=env, log_path=logs / "coordinator.log")
        self.slots: list[Slot] = []
        for i in range(cfg.workers):
            name = f"w{i}"
            wargs = ["worker", "--coordinator", self.url, "--trainer", "vcasync.demo.trainer:train",
                     "--state-dir", str(self.run_dir / "workers" / name), "--name", name,
                     "--grace-period", str(cfg.grace_s), "--threads", "1", "--on-preempt", "checkpoint"]
            self.slots.append(Slot(i, Proc(name, wargs, env=env, log_path=logs / f"{name}.log")))
        self.market = SpotMarket(self.slots, self.timeline, self.run_dir / "events", self.rng,
                                 stop=self.stop_injecting, kill_fraction=cfg.kill_fraction)
        self.market.asked = cfg.preemptions if cfg.preempt_per_min <= 0 else None
        self.market.rate_per_min = cfg.preempt_per_min if cfg.preempt_per_min > 0 else None

    # -- coordinator ---------------------------------------------------------------------------
    async def start_coordinator(self) -> None:
        import aiohttp

        await self.coordinator.start()
        self.timeline.add("coordinator", "start", f"pid {self.coordinator.pid}")
        deadline = time.monotonic() + 120.0
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                if not self.coordinator.running:
                    if self.restarting and await self.coordinator.wait(0) == 0:
                        # the run had finished and the restart found it done (and wrote the final
                        # weights) and exited: a start after a clean stop does; one that took the
                        # run over from the SIGKILL serves linger_s first, so is seen up above
                        self.found_finished = True
                        self.timeline.add("coordinator", "ready", "the run had finished: nothing to serve")
                        return
                    raise ConfigError(f"the coordinator exited at start; see {self.coordinator.log_path}")
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with http.get(f"{self.url}/healthz") as resp:
                        if resp.status == 200:
                            self.timeline.add("coordinator", "ready")
                            return
                await asyncio.sleep(0.2)
        raise ConfigError(f"the coordinator did not come up in 120 s; see {self.coordinator.log_path}")

    async def restart_coordinator_once(self, monitor: Any) -> None:
        """SIGKILL the coordinator when ~40 % of the units are done, then start it again; not once
        the run has finished (a short run can finish between two looks): nothing is left to
        recover into, and the kill would leave the final model unscored. The kill and restart run
        to the end even when the run finishes meanwhile (``await`` the task, do not cancel it once
        :attr:`restarting` is set)."""
        while True:
            await asyncio.sleep(0.5)
            await monitor.poll()              # a fresh look: the run may have finished meanwhile
            if monitor.finished():
                self.timeline.add("coordinator", "not killed", "the run finished before 40 % was seen")
                return
            done = monitor.units_done()
            if done is not None and done >= 0.4 * self.total_units:
                break
        self.restarting = True
        self.coordinator.send(signal.SIGKILL)
        await self.coordinator.wait()
        self.timeline.add("coordinator", "killed", "SIGKILL")
        await asyncio.sleep(1.0)
        try:
            await self.start_coordinator()
        except ConfigError as exc:
            # the restarted coordinator exited at start (killed from outside meanwhile, a crash) or
            # never answered: the run ends as for a coordinator lost on its own (a report, exit 5).
            # Raised inside the fleet's task group, it was an ExceptionGroup traceback (exit 1) and
            # no report
            code = self.coordinator.returncode      # None: up but never answered, stopped here
            await self.coordinator.stop(5.0)
            t = self.timeline.now()
            how = "stopped by the demo" if code is None else _exit_how(code)
            self.timeline.add("coordinator", "exited", f"at its --kill-coordinator restart: {how}")
            self.coordinator_lost = (f"the coordinator restarted by --kill-coordinator did not come back "
                                     f"({how}) at about {t:.0f} s, before the run finished: {exc}")
            return
        self.coordinator_restarts += 1
        self.timeline.add("coordinator", "recovered")

    def coordinator_exited(self, restart_done: bool) -> str | None:
        """Why, once the coordinator process has exited on its own (else None): not killed and being
        restarted by ``--kill-coordinator`` (``restart_done`` False meanwhile), nor a restart that
        found the run finished. Its workers retried it until ``--max-wall`` (15 minutes by default),
        and the demo said only that the fleet did not finish in time."""
        if self.coordinator_lost is not None:
            return self.coordinator_lost
        code = self.coordinator.returncode
        if code is None or not restart_done or self.found_finished:
            return None
        how = _exit_how(code)
        t = self.timeline.now()
        self.timeline.add("coordinator", "exited", how)
        if self.final_weights.exists():
            # it wrote the final weights at the run's end, then was lost before the demo's next look
            # or before every worker heard it: "before the run finished" was said of a run whose
            # every unit was merged
            when = (f"after the run finished (it had written {self.final_weights}) but before the "
                    f"demo saw it; the figures are those last scored before")
        else:
            when = "before the run finished"
        self.coordinator_lost = (f"the coordinator exited on its own ({how}) at about {t:.0f} s, {when}; "
                                 f"see {self.coordinator.log_path}")
        return self.coordinator_lost

    # -- workers ---------------------------------------------------------------------------------
    async def run_slot(self, slot: Slot) -> None:
        """Start the slot's worker; bring it back after each preemption until it finishes."""
        crashes = 0
        while True:
            await slot.proc.start()
            slot.went_up(self.timeline.now())
            self.timeline.add(slot.name, "start" if slot.starts == 1 else "restart", f"pid {slot.proc.pid}")
            code = await slot.proc.wait()
            t = self.timeline.now()
            if slot.state == "preempting":
                slot.went_down(t, "preempted")
                self.timeline.add(slot.name, "down", f"exit {code}")
                lo, hi = self.cfg.restart_delay_s
                await asyncio.sleep(self.rng.uniform(lo, hi))
                slot.state = "starting"
                continue
            if code == 0:
                slot.went_down(t, "done")
                self.timeline.add(slot.name, "done")
                self.stop_injecting.set()  # the run is in its tail: stop preempting
                return
            crashes += 1
            slot.went_down(t, "failed")
            self.timeline.add(slot.name, "crash", f"exit {code}")
            if crashes > MAX_CRASHES:
                return
            await asyncio.sleep(1.0)
            slot.state = "starting"

    async def stop_slot(self, slot: Slot, why: str) -> None:
        """Stop a slot's worker from outside its :meth:`run_slot` (cancelled first): at the limit, or
        when the demo itself fails. The open session is closed when the process has stopped, and
        said on the timeline: a cancelled ``run_slot`` closed nothing, so the session was never
        billed (``--max-wall 4`` priced the fleet at its coordinator alone, a 91 % "saving")."""
        was_running = slot.proc.running
        code = await slot.proc.stop(self.cfg.grace_s + 5)
        if slot.up_since is None:       # between sessions (a restart delay): nothing was up
            return
        t = self.timeline.now()
        if not was_running and code == 0:
            # it had exited on its own, done, before its task saw it (the limit came at that moment)
            slot.went_down(t, "done")
            self.timeline.add(slot.name, "done")
        elif not was_running:
            slot.went_down(t, "failed")
            self.timeline.add(slot.name, "crash", f"exit {code}")
        else:
            slot.went_down(t, "stopped")
            self.timeline.add(slot.name, "stopped", f"{why}, exit {code}")

    def why_incomplete(self, limit_s: float | None, merged_after: int) -> str:
        """Why the fleet did not finish, from what happened: the limit, workers that gave up after
        repeated crashes (a slot ends at its crash after :data:`MAX_CRASHES`), or a coordinator that
        never said finished."""
        cfg = self.cfg
        if limit_s is not None:
            after = (f"; {merged_after} result(s) merged while the workers were stopped are not counted"
                     if merged_after else "")
            return (f"the fleet did not finish within --max-wall {cfg.max_wall_s:g} s (stopped at "
                    f"{limit_s:.1f} s, its figures taken there){after}")
        # (a --kill-coordinator restart is over by now: the run waits for it before its last look)
        lost = self.coordinator_exited(restart_done=True)
        if lost is not None:
            return lost
        failed = [s for s in self.slots if s.state == "failed"]
        crashes = sum(1 for e in self.timeline.events if e.kind == "crash")
        if failed:
            last = failed[-1].proc.log_path
            line = _last_error(last)
            who = "every worker" if len(failed) == len(self.slots) else \
                f"{len(failed)} of {len(self.slots)} workers"
            return (f"{who} stopped after repeated crashes ({crashes} crash(es) in all; a worker is not "
                    f"restarted after its crash number {MAX_CRASHES + 1}); see "
                    f"{last}{': ' + line if line else ''}")
        stopped = [s.name for s in self.slots if s.state == "stopped"]
        if stopped:
            return (f"{', '.join(stopped)} did not exit within {cfg.grace_s + 5:g} s of the run "
                    f"finishing at the limit and were stopped; see {self.run_dir / 'logs'}")
        return (f"the workers exited but the coordinator never said the run finished; see "
                f"{self.run_dir / 'logs'}")

    async def inject(self) -> None:
        """Play the spot market (:mod:`vcasync.demo.market`) until the run is in its tail."""
        cfg = self.cfg
        market = self.market
        if cfg.preempt_per_min > 0:
            await market.in_time(cfg.preempt_per_min)
        elif cfg.preemptions > 0:
            await market.by_progress(cfg.preemptions, self.total_units)


def _exit_how(code: int) -> str:
    """How the coordinator process ended, for the report: a signal, or an exit status."""
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
    if code == 130:   # ExitCode.INTERRUPTED: a SIGINT to the group the demo itself ignores (cmd &)
        how += ": it was sent SIGINT or SIGTERM"
    return how


def _last_error(log: Path) -> str:
    """The last error line of a worker's log (else its last line), for the exit message."""
    try:
        lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    errors = [x for x in lines if re.search(r"\bERROR\b|Error\b", x)]
    return (errors or lines or [""])[-1][:300]


@contextlib.asynccontextmanager
async def _as_async(cm: contextlib.AbstractContextManager[Any]) -> AsyncIterator[Any]:
    """A synchronous context manager (rich's ``Live``) inside an ``async with`` list."""
    with cm as value:
        yield value


async def run_demo(cfg: DemoConfig) -> DemoRun:
    """Run the whole demo; returns what the report needs (the report is written by the caller)."""
    from ..examples.workloads import get_workload
    from ..worker._client import CoordinatorClient
    from .monitor import Monitor, live_display

    work = get_workload(cfg.workload)
    cfg.check_data(work.num_train)   # before the run directory or storage is touched
    if cfg.storage is not None:
        await _check_fresh_storage(cfg.storage)
    demo = _Demo(cfg, work.num_train, work.model_ref)
    out = DemoRun(cfg, demo.run_dir, demo.timeline, demo.slots, demo.total_units, demo.unit_steps)
    live_ctx: Any = contextlib.nullcontext()
    if cfg.progress:
        from rich.console import Console

        live_ctx = live_display(Console(stderr=True))
    try:
        await demo.start_coordinator()
        # stderr: --json keeps stdout for the report's figures
        print(f"status page: {demo.url}/status/ (live while the run lasts)", file=sys.stderr, flush=True)
        async with CoordinatorClient(demo.url) as client, _as_async(live_ctx) as live:
            await client.join(demo.secret, name="demo-monitor", info={"role": "monitor"})
            mon = Monitor(client, work, demo.run_dir / "scratch", demo.timeline.t0, demo.total_units)
            async with asyncio.TaskGroup() as tg:
                slot_tasks = [tg.create_task(demo.run_slot(s)) for s in demo.slots]
                injector = tg.create_task(demo.inject())
                killer = tg.create_task(demo.restart_coordinator_once(mon)) if cfg.kill_coordinator else None
                next_eval = 0.0
                limit_s: float | None = None
                while not all(t.done() for t in slot_tasks):
                    if demo.timeline.now() > cfg.max_wall_s:
                        # a fresh look first: the run may have finished as the limit came (it was
                        # then reported unfinished, its workers stopped on their way out)
                        await mon.poll()
                        if not mon.finished() or demo.timeline.now() > cfg.max_wall_s + cfg.grace_s + 5:
                            if not mon.finished():
                                await mon.score()        # the fleet as it stood at the limit
                                limit_s = demo.timeline.now()
                                demo.timeline.add("fleet", "max-wall", f"--max-wall {cfg.max_wall_s:g} s")
                            break
                    await mon.poll()
                    if mon.finished():
                        demo.stop_injecting.set()  # every unit is merged: nothing left to preempt
                    elif demo.coordinator_exited(killer is None or killer.done()) is not None:
                        break                      # nothing to train against: stop the fleet now
                    if demo.timeline.now() >= next_eval:
                        await mon.score()
                        next_eval = demo.timeline.now() + cfg.eval_every_s
                    if live is not None:
                        state = "restarting" if not demo.coordinator.running else "up"
                        live.update(mon.render(demo.slots, demo.timeline.now(), state), refresh=True)
                    await asyncio.sleep(0.5)
                demo.stop_injecting.set()
                if killer is not None and not killer.done():
                    if demo.restarting:
                        await killer             # killed: let it come back before the last score
                    else:
                        killer.cancel()
                injector.cancel()
                pending = [(s, t) for s, t in zip(demo.slots, slot_tasks, strict=True) if not t.done()]
                for _, t in pending:
                    t.cancel()
                if pending:
                    await asyncio.wait([t for _, t in pending])
                # all at once: one after the other, a worker kept merging while the one before it
                # was given its grace period
                await asyncio.gather(*(demo.stop_slot(s, "--max-wall" if limit_s is not None
                                                      else "the fleet was stopped") for s, _ in pending))
                if limit_s is not None:
                    # the sessions run until here, past the limit by up to the grace period
                    out.workers_stopped_s = demo.timeline.now()
            # the last look: from a coordinator that is up (a restart can be finishing), and a run
            # is finished when its workers are done *and* the coordinator says so. Past the limit
            # only the status is read: the model scored at the limit is the fleet's.
            scored_at_limit = limit_s is not None and bool(mon.accuracy)
            for _ in range(1 if demo.found_finished or demo.coordinator_lost else 40):
                await mon.poll()
                if "unreachable" not in mon.status and (scored_at_limit or await mon.score() is not None):
                    break
                await asyncio.sleep(0.5)
            else:
                if demo.found_finished and demo.final_weights.exists():
                    mon.score_weights(demo.final_weights)      # the run's own final weights
            out.finished = (limit_s is None and all(s.state == "done" for s in demo.slots)
                            and (mon.finished() or demo.found_finished))
            versions = list(mon.versions)
            if limit_s is not None:
                before = [(t, v) for t, v in versions if t <= limit_s]
                out.merged_after_limit = max(0, mon.version - (before[-1][1] if before else 0))
                versions = before
            out.limit_s = limit_s
            if not out.finished:
                out.incomplete_reason = demo.why_incomplete(limit_s, out.merged_after_limit)
            out.status = mon.status
            out.accuracy = [(p.t_s, p.version, p.units_done, p.accuracy, p.loss) for p in mon.accuracy]
            out.versions = versions
            out.coordinator_cpu = list(mon.coordinator_cpu)
            out.scored_s = list(mon.scored_s)
            out.wall_s = demo.timeline.now()
    except (asyncio.CancelledError, KeyboardInterrupt):
        # Ctrl-C or SIGTERM (vcasync.demo.cli cancels the run on it): said before the clean-up below,
        # which takes up to the workers' grace period
        print(f"vcasync demo: interrupted: stopping the workers and the coordinator; no report is "
              f"written (the logs and state are in {demo.run_dir})", file=sys.stderr, flush=True)
        raise
    finally:
        # all at once: one after the other, an interrupted demo took a grace period per worker
        await asyncio.gather(*(demo.stop_slot(s, "the demo stopped") for s in demo.slots
                               if s.proc.running or s.up_since is not None))
        await demo.coordinator.stop(15.0)
        demo.timeline.add("coordinator", "stopped")
    out.coordinator_restarts = demo.coordinator_restarts
    out.market = demo.market.stats()
    return out
