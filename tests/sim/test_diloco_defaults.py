"""diloco at its defaults trains: until 2026-12-08 each result took the outer Nesterov step (rate
0.7, momentum 0.9) meant for a round's mean, and a default run ended at chance (10 % on digits)."""

from __future__ import annotations

import pytest

pytest.importorskip("vcasync.coordinator", reason="the simulator drives the real Coordinator")

from vcasync.sim import FleetConfig, SimConfig, Simulation, summarize


def test_diloco_at_its_defaults_ends_well_above_chance_on_digits() -> None:
    cfg = SimConfig(signal="digits", policy="diloco", fleet=FleetConfig(workers=4),
                    epochs=3, seed=0, sync_baseline=False, keep_timeline=False, eval_points=5)
    s = summarize(Simulation(cfg).run())
    assert s["finished"]
    assert s["final_accuracy"] > 0.5, s["final_accuracy"]
