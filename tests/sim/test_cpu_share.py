"""Processor sharing in the simulator: a fleet on fewer cores than processes computes slower."""

from __future__ import annotations

import pytest

from vcasync.errors import ConfigError
from vcasync.sim import FleetConfig, NoPreemption, SimConfig, Simulation
from vcasync.sim.cpu import CpuShare


def test_the_stretch_is_runnable_processes_over_cores_and_never_below_one() -> None:
    cpu = CpuShare(cores=2, extra=1)
    assert cpu.stretch() == 1.0          # 1 busy process on 2 cores
    cpu.running = 5
    assert cpu.stretch() == 3.0          # (5 + 1) / 2
    assert cpu.stretch_for(3) == 2.0
    assert CpuShare().stretch_for(1000) == 1.0   # a machine per worker
    with pytest.raises(ConfigError, match="cores"):
        CpuShare(cores=0)
    with pytest.raises(ConfigError, match="cores"):
        SimConfig(cores=-1)


def _duration(cores: float | None) -> tuple[float, float]:
    cfg = SimConfig(signal="surrogate", fleet=FleetConfig.identical(4, bandwidth_bps=1e12, latency_s=0.0),
                    preemption=NoPreemption(), epochs=1, shards=8, local_steps=10, sample_cost_s=0.01,
                    boot_s=1.0, cores=cores, eval_points=2, seed=0, keep_timeline=False)
    out = Simulation(cfg).run()
    assert out.sync is not None
    return out.duration_s, out.sync.duration_s


def test_four_workers_on_two_cores_take_about_twice_as_long_to_compute() -> None:
    alone, sync_alone = _duration(None)
    shared, sync_shared = _duration(2)
    # 8 units of 10 steps x 32 samples x 0.01 s on 4 machines: 6.4 s of compute after 1 s of boot
    assert shared - 1.0 == pytest.approx(2 * (alone - 1.0), rel=0.05)
    assert sync_shared - 1.0 == pytest.approx(2 * (sync_alone - 1.0), rel=0.05)



def test_a_slow_merge_loop_queues_the_uploads() -> None:
    """Results arriving faster than the coordinator merges them wait: 8 merges of 2 s each take 16 s."""
    def run(merge_s: float) -> float:
        cfg = SimConfig(signal="surrogate", fleet=FleetConfig.identical(4, bandwidth_bps=1e12, latency_s=0.0),
                        preemption=NoPreemption(), epochs=1, shards=8, local_steps=1, sample_cost_s=1e-6,
                        boot_s=1.0, merge_s=merge_s, eval_points=2, seed=0, keep_timeline=False,
                        sync_baseline=False)
        return Simulation(cfg).run().duration_s

    assert run(2.0) - run(0.0) == pytest.approx(16.0, abs=0.5)
    with pytest.raises(ConfigError, match="merge_s"):
        SimConfig(merge_s=-1.0)


def _unit_cpu_run(unit_cpu_s: float, cores: float | None) -> float:
    cfg = SimConfig(signal="surrogate", fleet=FleetConfig.identical(4, bandwidth_bps=1e12, latency_s=0.0),
                    preemption=NoPreemption(), epochs=1, shards=8, local_steps=1, sample_cost_s=1e-6,
                    boot_s=1.0, cores=cores, unit_cpu_s=unit_cpu_s, eval_points=2, seed=0,
                    keep_timeline=False, sync_baseline=False)
    return Simulation(cfg).run().duration_s


def test_the_cpu_between_units_is_paid_and_shared_like_training() -> None:
    """8 units on 4 workers, 1 s of CPU each outside training: 2 rounds of 1 s on a machine per
    worker, twice that when the four share 2 cores; none of it without ``unit_cpu_s``."""
    free = _unit_cpu_run(0.0, 2)
    assert _unit_cpu_run(1.0, None) - free == pytest.approx(2.0, abs=0.1)
    assert _unit_cpu_run(1.0, 2) - free == pytest.approx(4.0, abs=0.2)
    with pytest.raises(ConfigError, match="unit_cpu_s"):
        SimConfig(unit_cpu_s=-0.1)
