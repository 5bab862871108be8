"""bench.gap_sweep's samples to target: the first evaluation within the headline's tolerance of
DDP's final quality, on each side's own curve."""

from __future__ import annotations

from bench.gap_sweep import samples_to
from vcasync.costing.target import Target


def test_the_first_point_within_tolerance_counts_not_the_best() -> None:
    acc = Target.from_baseline("accuracy", 0.90)          # 0.895
    assert samples_to(acc, [(0, 0.10), (500, 0.896), (1000, 0.85), (1500, 0.95)]) == 500
    assert samples_to(acc, [(0, 0.10), (500, 0.894)]) is None
    loss = Target.from_baseline("loss", 2.0)              # 2.02, lower is better
    assert samples_to(loss, [(0, 5.0), (300, 2.03), (600, 2.01)]) == 600
