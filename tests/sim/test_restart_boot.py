"""A slot's first start-up and a restart's are apart: in one of the benchmark's real runs the
fleet's first start (every worker at once on 2 cores) took 9.7 s, its restarts 5.4 s, and one
figure for both (their median, 6.6 s) started the replay's training 3 s before the run's."""

from __future__ import annotations

import pytest

from vcasync.errors import ConfigError
from vcasync.sim import FleetConfig, SimConfig, Simulation, TracePreemption
from vcasync.sim.fleet import Outage


def _first_leases(restart_boot_s: float | None) -> list[float]:
    """Slot 0's lease times: it is killed at 5 s and back at 6 s."""
    trace = TracePreemption([(0, Outage(5.0, 6.0, 0.0))])
    cfg = SimConfig(signal="surrogate", fleet=FleetConfig.identical(2, bandwidth_bps=1e12, latency_s=0.0),
                    preemption=trace, epochs=4, shards=4, local_steps=10, sample_cost_s=0.01,
                    boot_s=3.0, restart_boot_s=restart_boot_s, eval_points=2, seed=0,
                    sync_baseline=False)
    out = Simulation(cfg).run()
    ups = [e.t_s for e in out.rec.timeline if e.slot == 0 and e.kind == "up"]
    assert ups == [0.0, 6.0]
    return [e.t_s for e in out.rec.timeline if e.slot == 0 and e.kind == "lease"]


def test_a_restart_takes_its_own_start_up_the_first_session_boot_s() -> None:
    leases = _first_leases(0.5)
    assert leases[0] == pytest.approx(3.0)                          # boot_s from the run's start
    assert min(t for t in leases if t >= 6.0) == pytest.approx(6.5)  # restart_boot_s after coming back
    # unset, a restart boots as long as a first start
    assert min(t for t in _first_leases(None) if t >= 6.0) == pytest.approx(9.0)
    with pytest.raises(ConfigError, match="restart_boot_s"):
        SimConfig(restart_boot_s=-1.0)
