"""The simulator's configuration: one frozen value that says everything about a run."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..coerce import SEED_RANGE, is_finite_number, is_seed
from ..costing.market import SpotTrace, SpotWalk
from ..costing.prices import DEFAULT_COORDINATOR_INSTANCE, DEFAULT_INSTANCE, PriceTable
from ..errors import ConfigError
from .fleet import FleetConfig, NoPreemption, PreemptionModel, TracePreemption

__all__ = ["MAX_EPOCHS", "MAX_LOCAL_STEPS", "NoticeAction", "SimConfig"]

#: The most steps one work unit may train (``local_steps``): a unit's steps are really trained, at
#: about 5 ms a step, so 10**5 is minutes per unit; 2**40 ran for ever.
MAX_LOCAL_STEPS = 100_000
#: The most passes over the training set (``epochs``): each pass makes ``shards`` units.
MAX_EPOCHS = 10_000

#: What a worker does with a preemption notice: upload a partial result (weighted by the steps done),
#: or drop the unit (its lease expires and the unit is trained again by someone else).
NoticeAction = Literal["partial", "abandon"]


@dataclass(frozen=True)
class SimConfig:
    """One simulated run. ``None`` means the training signal's default.

    Workload: ``epochs`` passes over the signal's training set, split into ``shards`` shards (each
    unit trains one shard for ``local_steps`` steps; default one pass). Time: a reference machine
    needs ``sample_cost_s`` virtual seconds per training sample; a machine of speed ``s`` needs
    ``sample_cost_s / s``. Transfers move ``model_bytes`` (default: the model's real size) over the
    machine's link. ``max_staleness`` defaults to twice the number of workers (with ``N`` workers
    busy, a result is typically about ``N`` versions old when it arrives).

    Learning rates: ``lr`` (the workers') and ``sync_lr`` (the synchronous baseline's) both default
    to the signal's base rate times ``sqrt(N)`` when None (0 is refused, not taken for the default: a
    rate must be finite and > 0). Synchronous SGD over ``N`` workers takes one step on
    an ``N``-times larger batch; VC-ASGD with ``N`` workers in flight advances the model by about one
    worker's progress per ``N`` merges (each result is averaged into a model that moved on), so it is
    a large-batch method too, and the same square-root rule suits both (on digits at 8 workers a
    sweep found 0.14 best for synchronous SGD, and 0.1-0.14 best for VC-ASGD). That rule is the
    default where no search is run; ``bench/convergence.py`` searches both rates on a grid, with the
    same budget on both sides, scoring on ``eval_split="validation"``.

    ``sync_batch_size``: the synchronous baseline's minibatch per worker (None: the fleet's
    ``batch_size``). Its step trains on ``N`` times that, so at many workers on a small data set the
    fleet's batch gives synchronous SGD few, huge steps: on digits, 64 workers x 32 samples for 60
    epochs is 38 steps of 2,048 of the 1,437 images, and the best searched rate ended at 73 % on
    validation, where 8 a worker (152 steps of 512) reached 97 %. A user running data-parallel
    training on 64 machines shrinks the per-machine batch; ``bench/convergence.py`` searches it.

    Start-up: a session's machine needs ``boot_s`` virtual seconds before it joins (booting,
    installing, loading the framework); a slot's first session, at the run's start, takes
    ``boot_s``, a session after a preemption ``restart_boot_s`` (None: ``boot_s`` too). They differ
    where the whole fleet starts at once on shared resources: in the benchmark's real runs on 2
    cores (``bench/convergence.py`` measures both in each run it replays) the four workers' first
    start-ups, to the end of their first unit, took 9.7 s on one seed and its restarts 5.4 s; over
    10 seeds the two differed by up to 10 s, either way.

    Leases: ``lease_timeout_s`` None is what an operator would set: 600 s, or three of the slowest
    machine's steps when a step takes longer (the coordinator extends a lease only on progress, so a
    timeout shorter than one step expires every lease that machine takes, and after five such
    failures a unit is parked and its samples never trained).

    Evaluation: workloads are scored on ``eval_split`` (``test``, or ``validation`` for choosing
    hyper-parameters). CPU: ``cores`` (None: one machine per worker) and ``extra_runnable`` always-busy
    processes make the fleet share processors (:mod:`vcasync.sim.cpu`), to replay a real run of many
    processes on one small machine; ``merge_s`` is the coordinator's time per merge, a queue the
    workers' uploads wait in (:class:`vcasync.sim.cpu.MergeQueue`; 0: merging is free);
    ``unit_cpu_s`` the CPU seconds a worker spends on each unit outside training (encoding and
    uploading its result, leasing, downloading and decoding the next model), on the reference
    machine: with ``cores`` set it shares the processors like training does (0: that work is free,
    only the link's latency and bandwidth are paid). ``notice_cpu``: the cores a noticed session
    keeps busy from when it has stopped working to the kill (0-1; 0: it frees its core at once): a
    real worker finishes its step, checkpoints and exits after SIGTERM, on the benchmark's 2-core
    machine in 1.5-5 s at 0.35-0.45 of a core, on the cores the others train on.

    Scoring instants: ``eval_at_s`` (virtual seconds; empty: ``eval_points`` on a regular grid)
    scores the model at those instants, as the demo's monitor does (every 3 s after the last score
    ended), and after the last at the last interval; each such point is stamped when its version
    was merged, as the monitor stamps a score by when its version first showed, so a crossing of
    the target is seen only at the next instant, at the time of the version that made it.

    Prices: the fleet's workers pay ``prices[instance]``'s spot rate, or with ``spot_path`` (a
    :class:`~vcasync.costing.market.SpotTrace` or :class:`~vcasync.costing.market.SpotWalk`) a
    price that moves during the run, its times virtual seconds from the run's start (the virtual
    clock's 0); the coordinator and the synchronous baseline pay on demand.
    """

    @property
    def staleness_window(self) -> int:
        return self.max_staleness if self.max_staleness is not None else max(16, 2 * self.fleet.workers)

    signal: str = "surrogate"
    policy: str = "vcasgd"
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    preemption: PreemptionModel = field(default_factory=NoPreemption)
    epochs: int = 5
    shards: int | None = None
    local_steps: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    momentum: float = 0.9
    sample_cost_s: float | None = None
    model_bytes: int | None = None
    boot_s: float = 30.0
    restart_boot_s: float | None = None
    heartbeat_s: float = 60.0
    lease_timeout_s: float | None = None
    max_staleness: int | None = None
    on_notice: NoticeAction = "partial"
    instance: str = DEFAULT_INSTANCE
    coordinator_instance: str = DEFAULT_COORDINATOR_INSTANCE
    prices: PriceTable = field(default_factory=PriceTable)
    #: the fleet's spot price over the run (a trace or a walk, :mod:`vcasync.costing.market`), its
    #: ``t_s`` virtual seconds from the run's start; None: the table's fixed spot rate
    spot_path: SpotTrace | SpotWalk | None = None
    eval_points: int = 60
    target_accuracy: float | None = None
    sync_baseline: bool = True
    sync_lr: float | None = None
    sync_batch_size: int | None = None
    eval_split: str = "test"
    cores: float | None = None
    extra_runnable: float = 0.0
    merge_s: float = 0.0
    unit_cpu_s: float = 0.0
    notice_cpu: float = 0.0
    eval_at_s: tuple[float, ...] = ()
    seed: int = 0
    max_virtual_s: float = 30 * 24 * 3600.0
    keep_timeline: bool = True

    def __post_init__(self) -> None:
        def finite(x: float | None) -> bool:   # None is the default; NaN and inf are neither
            return x is None or is_finite_number(x)

        def rate(name: str) -> tuple[bool, str]:
            # None means the default (base rate x sqrt(workers)); 0 is not "the default" but a
            # learning rate that never learns, and NaN or a negative one made a baseline that never
            # learned and a saving priced against it
            x: float | None = getattr(self, name)
            return (x is None or (math.isfinite(x) and x > 0),
                    f"{name} must be a finite learning rate > 0 (None: the default), got {x}")

        checks: list[tuple[bool, str]] = [
            (1 <= self.epochs <= MAX_EPOCHS, f"epochs must be in [1, {MAX_EPOCHS}], got {self.epochs}"),
            (self.shards is None or self.shards >= 1, f"shards must be >= 1, got {self.shards}"),
            (self.local_steps is None or 1 <= self.local_steps <= MAX_LOCAL_STEPS,
             f"local_steps must be in [1, {MAX_LOCAL_STEPS}], got {self.local_steps}"),
            (self.batch_size is None or self.batch_size >= 1,
             f"batch_size must be >= 1, got {self.batch_size}"),
            (self.sync_batch_size is None or self.sync_batch_size >= 1,
             f"sync_batch_size must be >= 1 (None: the fleet's batch), got {self.sync_batch_size}"),
            rate("lr"),
            rate("sync_lr"),
            (0 <= self.momentum < 1, f"momentum must be in [0, 1), got {self.momentum}"),
            (self.sample_cost_s is None or (math.isfinite(self.sample_cost_s) and self.sample_cost_s > 0),
             f"sample_cost_s must be a finite number > 0, got {self.sample_cost_s}"),
            (self.model_bytes is None or self.model_bytes >= 0,
             f"model_bytes must be >= 0, got {self.model_bytes}"),
            (finite(self.boot_s) and self.boot_s >= 0,
             f"boot_s must be a finite number >= 0, got {self.boot_s}"),
            (self.restart_boot_s is None or (finite(self.restart_boot_s) and self.restart_boot_s >= 0),
             f"restart_boot_s must be a finite number >= 0 (None: boot_s), got {self.restart_boot_s}"),
            (finite(self.heartbeat_s) and self.heartbeat_s > 0,
             f"heartbeat_s must be a finite number > 0, got {self.heartbeat_s}"),
            (self.lease_timeout_s is None or (finite(self.lease_timeout_s) and self.lease_timeout_s > 0),
             f"lease_timeout_s must be a finite number > 0, got {self.lease_timeout_s}"),
            (self.max_staleness is None or self.max_staleness >= 0,
             f"max_staleness must be >= 0, got {self.max_staleness}"),
            (self.on_notice in ("partial", "abandon"),
             f"on_notice must be 'partial' or 'abandon', got {self.on_notice!r}"),
            (self.eval_points >= 2, f"eval_points must be >= 2, got {self.eval_points}"),
            (self.target_accuracy is None or 0 < self.target_accuracy <= 1,
             f"target_accuracy must be in (0, 1], got {self.target_accuracy}"),
            (self.max_virtual_s > 0 and math.isfinite(self.max_virtual_s),
             f"max_virtual_s must be a finite number > 0, got {self.max_virtual_s}"),
            (is_seed(self.seed), f"seed must be in {SEED_RANGE}, got {self.seed}"),
            (self.eval_split in ("validation", "test"),
             f"eval_split must be 'validation' or 'test', got {self.eval_split!r}"),
            (self.cores is None or (math.isfinite(self.cores) and self.cores > 0),
             f"cores must be a finite number > 0, got {self.cores}"),
            (finite(self.extra_runnable) and self.extra_runnable >= 0,
             f"extra_runnable must be a finite number >= 0, got {self.extra_runnable}"),
            (finite(self.merge_s) and self.merge_s >= 0,
             f"merge_s must be a finite number >= 0, got {self.merge_s}"),
            (finite(self.unit_cpu_s) and self.unit_cpu_s >= 0,
             f"unit_cpu_s must be a finite number >= 0, got {self.unit_cpu_s}"),
            (self.spot_path is None or isinstance(self.spot_path, SpotTrace | SpotWalk),
             f"spot_path must be a SpotTrace, a SpotWalk or None, got {self.spot_path!r}"),
            (finite(self.notice_cpu) and 0 <= self.notice_cpu <= 1,
             f"notice_cpu must be a share of a core in [0, 1], got {self.notice_cpu}"),
            (all(is_finite_number(t) and t >= 0 for t in self.eval_at_s)
             and list(self.eval_at_s) == sorted(self.eval_at_s),
             f"eval_at_s must be finite virtual times >= 0 in increasing order, got "
             f"{list(self.eval_at_s)[:5]}{' ...' if len(self.eval_at_s) > 5 else ''}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        if isinstance(self.preemption, TracePreemption):
            self.preemption.check_fleet(self.fleet.workers)
        self.prices.resolve(self.instance)
        self.prices.resolve(self.coordinator_instance)
