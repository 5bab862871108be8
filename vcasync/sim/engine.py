"""The fleet simulator: the real coordinator, ledger and merge policy on a virtual clock.

:class:`Simulation` builds a :class:`~vcasync.coordinator.Coordinator` over ``memory://`` storage
with the policy named in the config (``build_policy``), gives it the virtual clock, and runs one
:class:`~vcasync.sim.worker.SimWorker` session per slot whenever the slot's machine is up. The
preemption model decides when machines go (after a notice, or at once) and when they come back.
An evaluation task scores the global model at regular virtual intervals. Afterwards the
synchronous on-demand baseline trains on the same number of samples and both are priced.

Everything random comes from the seed, and the event loop runs executor work inline (see
:mod:`vcasync.sim.clock`), so a run is deterministic for a seed.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import dataclass

from ..coordinator import Coordinator, CoordinatorConfig
from ..coordinator._config import MAX_LEASE_TIMEOUT_S
from ..errors import ConfigError
from ..examples.cnn import shard_indices
from ..examples.workloads import Metric
from ..ledger import make_units
from ..metrics import Histogram
from ..policy import build_policy
from ..storage import open_storage
from .clock import VirtualClock, run_virtual
from .config import SimConfig
from .cost import Billing
from .cpu import CpuShare, MergeQueue
from .fleet import MachineProfile, make_fleet
from .records import EvalPoint, Recorder
from .signals import TrainingSignal, make_signal
from .sync import SyncResult, simulate_sync
from .worker import ModelCache, SimWorker, Workload

__all__ = ["SimOutcome", "Simulation"]


class _ExactStaleness(Histogram):
    """The coordinator's staleness histogram that also counts each merge's exact staleness.

    Staleness is the number of versions merged between a result's base and its own merge, known only
    when the coordinator's merge loop takes the result: a worker that read the version when its
    upload ended was wrong whenever results queued for merging (64 uploads at once all read 0 while
    the coordinator merged them at 0, 1, ..., 63). Counting what the coordinator observes keeps the
    simulator's histogram the coordinator's own figure, per version instead of per bucket.
    """

    __slots__ = ("exact",)

    def __init__(self, inner: Histogram, exact: Counter[int]) -> None:
        super().__init__(inner.bounds)
        self.counts, self.count, self.sum = list(inner.counts), inner.count, inner.sum
        self.exact = exact

    def observe(self, value: float) -> None:
        super().observe(value)
        self.exact[int(value)] += 1


@dataclass(slots=True)
class SimOutcome:
    """Everything a run produced; :mod:`vcasync.sim.report` turns it into figures."""

    config: SimConfig
    fleet: list[MachineProfile]
    workload: Workload
    units: int
    unit_steps: int
    total_samples: int
    finished: bool
    duration_s: float
    final_version: int
    rec: Recorder
    billing: Billing
    sync: SyncResult | None
    coordinator_status: dict[str, object]
    #: units given up on after failing on several workers (unit id -> why): their samples were
    #: never trained, so a run with any is not ``finished``
    parked: dict[str, str]
    #: what the run is judged by: the signal's metric (``accuracy``, or ``loss`` for a language model)
    metric: Metric = "accuracy"
    #: the run stopped at ``config.max_virtual_s`` before the coordinator finished
    limit_reached: bool = False


class Simulation:
    """One seeded run of a :class:`SimConfig`; ``run()`` returns a :class:`SimOutcome`."""

    def __init__(self, config: SimConfig, signal: TrainingSignal | None = None) -> None:
        self.config = config
        self.signal = signal if signal is not None else make_signal(config.signal, config.eval_split)
        if config.target_accuracy is not None and self.signal.metric != "accuracy":
            raise ConfigError(f"signal {self.signal.name!r} is judged by validation {self.signal.metric}, "
                              "so a target accuracy does not apply (its target is the synchronous "
                              "baseline's final loss + 1 %)")
        self.fleet = make_fleet(config.fleet, config.seed)
        self.cpu = CpuShare(config.cores, config.extra_runnable)
        d = self.signal.defaults
        bs = config.batch_size or d.batch_size
        n_train = self.signal.num_train
        if config.shards is not None and config.shards > n_train:
            # it was cut to n_train without a word (the demo refuses it): a shard holds a sample
            raise ConfigError(f"--shards {config.shards} is more than the {self.signal.name} signal's "
                              f"{n_train:,} training samples: a shard holds at least one")
        shards = config.shards or min(4 * config.fleet.workers, max(1, n_train // (bs * 4)))
        shard_idx = tuple(shard_indices(n_train, s, shards) for s in range(shards))
        self.unit_steps = config.local_steps or max(1, math.ceil(len(shard_idx[0]) / bs))
        self.unit_list = make_units(shards, epochs=config.epochs, steps=self.unit_steps)
        self.total_samples = len(self.unit_list) * self.unit_steps * bs
        model_bytes = config.model_bytes
        if model_bytes is None:
            model_bytes = self.signal.initial_model(config.seed).nbytes
        self.workload = Workload(
            batch_size=bs, momentum=config.momentum,
            lr=d.lr * math.sqrt(config.fleet.workers) if config.lr is None else config.lr,
            sample_cost_s=config.sample_cost_s or d.sample_cost_s, unit_cpu_s=config.unit_cpu_s,
            model_bytes=model_bytes,
            boot_s=config.boot_s, heartbeat_s=config.heartbeat_s,
            idle_poll_s=min(60.0, config.heartbeat_s), on_notice=config.on_notice, seed=config.seed,
            shards=shard_idx)
        if config.lease_timeout_s is None and self.lease_timeout_s() > MAX_LEASE_TIMEOUT_S:
            # found only when the run built its coordinator, and said as a setting the command has
            # no flag for ("CoordinatorConfig.lease_timeout_s must be at most 604800 s")
            step_s = self.lease_timeout_s() / 3
            raise ConfigError(
                f"one training step of the slowest machine takes {step_s:,.0f} virtual s (--batch-size "
                f"{bs} x --sample-cost-s {self.workload.sample_cost_s:g} / its speed "
                f"{min(m.speed for m in self.fleet):.3g}), and a lease lasts three steps, at most "
                f"{MAX_LEASE_TIMEOUT_S:,.0f} s (a week): give a smaller --batch-size or --sample-cost-s, "
                "or a milder --slow-factor / --speed-sigma")

    # -- the run ----------------------------------------------------------------------------------
    def run(self) -> SimOutcome:
        outcome = run_virtual(self._main)
        if self.config.sync_baseline:
            outcome.sync = self.run_sync()
        return outcome

    def run_sync(self) -> SyncResult:
        """The synchronous on-demand baseline alone (what :meth:`run` adds when ``sync_baseline``):
        ``sync_lr`` (None: the signal's base rate x sqrt(workers)) and ``sync_batch_size`` per
        worker (None: the fleet's batch), on the same samples as the fleet."""
        w = self.workload
        sync_lr = self.config.sync_lr   # None is the default (SimConfig refuses 0, NaN and < 0)
        if sync_lr is None:
            sync_lr = self.signal.defaults.lr * math.sqrt(len(self.fleet))
        return simulate_sync(
            self.signal, self.fleet, total_samples=self.total_samples,
            batch_size=self.config.sync_batch_size or w.batch_size,
            lr=sync_lr, momentum=w.momentum, sample_cost_s=w.sample_cost_s,
            model_bytes=w.model_bytes, boot_s=w.boot_s, eval_points=self.config.eval_points,
            seed=self.config.seed, stretch=self.cpu.stretch_for(len(self.fleet)))

    def lease_timeout_s(self) -> float:
        """The configured timeout, else 600 s or three of the slowest machine's steps (with the
        processor sharing of the whole fleet computing at once), whichever is longer."""
        if self.config.lease_timeout_s is not None:
            return self.config.lease_timeout_s
        w = self.workload
        slowest = min(m.speed for m in self.fleet)
        step_s = w.batch_size * w.sample_cost_s / slowest * self.cpu.stretch_for(len(self.fleet))
        return max(600.0, 3.0 * step_s)

    def expected_duration_s(self) -> float:
        """A rough duration (all machines up, no waste) used to space evaluations."""
        speed = sum(m.speed for m in self.fleet)
        return self.workload.boot_s + self.total_samples * self.workload.sample_cost_s / speed

    async def _main(self, clock: VirtualClock) -> SimOutcome:
        cfg = self.config
        rec = Recorder(keep_timeline=cfg.keep_timeline)
        billing = Billing()
        model = self.signal.initial_model(cfg.seed)
        spec = model.spec
        policy = build_policy(cfg.policy, dict(cfg.policy_params))
        ccfg = CoordinatorConfig(max_staleness=cfg.staleness_window, durability="none",
                                 lease_timeout_s=self.lease_timeout_s())
        loop = asyncio.get_running_loop()
        async with open_storage(f"memory://vcasync-sim-{id(self)}") as storage, \
                Coordinator(model, self.unit_list, policy=policy, storage=storage, config=ccfg,
                            clock=clock) as coord:
            coord.metrics.staleness = _ExactStaleness(coord.metrics.staleness, rec.staleness)
            models = ModelCache(coord, spec, keep=cfg.staleness_window + 2)
            self.merges = MergeQueue(cfg.merge_s)
            finished, limit_reached = True, False
            # A slot that crashes is a bug in the simulator: the TaskGroup surfaces it.
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(self._slot(coord, m, models, rec, billing)) for m in self.fleet]
                tasks.append(tg.create_task(self._evaluate_loop(coord, models, rec)))
                try:
                    async with asyncio.timeout(cfg.max_virtual_s):
                        await coord.wait_finished()
                except TimeoutError:
                    finished = False
                    limit_reached = True
                end = loop.time()
                for task in tasks:
                    task.cancel()
            billing.stop_all(end)
            await self._evaluate(coord, models, rec)
            status = coord.status()
            version = coord.version
            # the coordinator's "finished" counts a parked unit as settled; a run that never
            # trained some of its units is not finished here (the real command exits 3 for it)
            parked = coord.parked()
            finished = finished and not parked
        return SimOutcome(cfg, self.fleet, self.workload, len(self.unit_list), self.unit_steps,
                          self.total_samples, finished, end, version, rec, billing, None, status,
                          parked, self.signal.metric, limit_reached)

    async def _slot(self, coord: Coordinator, profile: MachineProfile, models: ModelCache,
                    rec: Recorder, billing: Billing) -> None:
        loop = asyncio.get_running_loop()
        outages = self.config.preemption.outages(profile.slot, self.config.seed)
        nxt = next(outages, None)
        slot = profile.slot
        boot_s = self.config.boot_s     # the slot's first session; a restart's below
        while True:
            now = loop.time()
            while nxt is not None and nxt.down_s <= now:  # an outage that fell in the downtime
                nxt = next(outages, None)
            billing.start(slot, now)
            rec.event(now, slot, "up")
            worker = SimWorker(coord, self.signal, models, self.workload, profile, rec, self.cpu,
                               self.merges)
            notice = asyncio.Event()
            kill_at = nxt.down_s if nxt is not None else None
            handle = None
            if nxt is not None and nxt.notice_s > 0:
                handle = loop.call_at(max(now, nxt.down_s - nxt.notice_s), notice.set)
            killed = False
            try:
                async with asyncio.timeout_at(kill_at):
                    await worker.run(notice, boot_s)
                    if notice.is_set() and kill_at is not None:
                        # billed until reclaimed, on its way out on the shared cores meanwhile
                        self.cpu.exiting += self.config.notice_cpu
                        try:
                            await asyncio.sleep(max(0.0, kill_at - loop.time()))
                        finally:
                            self.cpu.exiting -= self.config.notice_cpu
            except TimeoutError:
                killed = True
            finally:
                if handle is not None:
                    handle.cancel()
            if nxt is None or not (killed or notice.is_set()):
                billing.stop(slot, loop.time())  # the run has no more work for this machine
                rec.event(loop.time(), slot, "done")
                return
            worker.account_kill()
            billing.stop(slot, loop.time())
            rec.preemptions += 1
            rec.hard_kills += int(nxt.hard)
            rec.event(loop.time(), slot, "preempted", "hard" if nxt.hard else "notice")
            await asyncio.sleep(max(0.0, nxt.up_s - loop.time()))
            nxt = next(outages, None)
            if self.config.restart_boot_s is not None:
                boot_s = self.config.restart_boot_s

    async def _evaluate_loop(self, coord: Coordinator, models: ModelCache, rec: Recorder) -> None:
        loop = asyncio.get_running_loop()
        at = self.config.eval_at_s
        if at:   # a monitor's instants, then its last interval
            for t in at:
                await asyncio.sleep(max(0.0, t - loop.time()))
                await self._evaluate(coord, models, rec)
            every = max(1e-3, at[-1] - at[-2]) if len(at) > 1 else max(1.0, at[-1])
        else:
            every = max(1.0, self.expected_duration_s() / self.config.eval_points)
        while True:
            await self._evaluate(coord, models, rec)
            await asyncio.sleep(every)

    async def _evaluate(self, coord: Coordinator, models: ModelCache, rec: Recorder) -> None:
        now = asyncio.get_running_loop().time()
        version = coord.version
        last = rec.evals[-1] if rec.evals else None
        if self.config.eval_at_s:
            # stamped when the version was merged, as the demo's monitor stamps a score; a version
            # scored already adds nothing (the monitor returns its point again)
            if last is not None and last.version == version:
                return
            ev = self.signal.evaluate(await models.get(version))
            stamp, merged = rec.merged_at.get(version, (now, rec.samples_merged))
            rec.evals.append(EvalPoint(min(now, stamp), version, merged, ev.accuracy, ev.loss))
            return
        if last is not None and last.version == version:
            point = EvalPoint(now, version, rec.samples_merged, last.accuracy, last.loss)
        else:
            ev = self.signal.evaluate(await models.get(version))
            point = EvalPoint(now, version, rec.samples_merged, ev.accuracy, ev.loss)
        if last is not None and last.t_s == now:
            rec.evals[-1] = point
        else:
            rec.evals.append(point)
