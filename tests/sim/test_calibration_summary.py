"""bench.convergence's calibration summary: the seeds' mean against the replays' mean, per side, and
the seeds where only the run or only its replay reached the target counted, not dropped."""

from __future__ import annotations

import pytest

from bench.convergence import calibration_summary


def _cal(workload: str, fleet: tuple[float | None, float | None],
         ddp: tuple[float | None, float | None]) -> dict[str, object]:
    return {"workload": workload, "real_fleet_s": fleet[0], "sim_fleet_s": fleet[1],
            "real_ddp_s": ddp[0], "sim_ddp_s": ddp[1]}


def test_per_seed_noise_averages_out_and_a_one_sided_miss_is_counted() -> None:
    cal = [_cal("mnist5000", (19.6, 28.6), (14.8, 16.7)),
           _cal("mnist5000", (33.6, 30.6), (15.1, 18.1)),
           _cal("mnist5000", (None, 40.0), (15.1, 18.1)),      # the run missed, its replay did not
           _cal("mnist5000", (19.0, 37.6), (14.6, 17.0)),
           _cal("digits", (10.0, None), (5.0, 5.5))]           # the replay missed
    s = calibration_summary(cal)
    fleet = s["mnist5000"]["fleet"]
    assert fleet["pairs"] == 3
    assert fleet["disagree"] == 1
    assert fleet["real_mean_s"] == pytest.approx((19.6 + 33.6 + 19.0) / 3)
    assert fleet["error"] == pytest.approx(abs(96.8 - 72.2) / 72.2)
    assert s["mnist5000"]["ddp"]["pairs"] == 4
    assert s["mnist5000"]["ddp"]["disagree"] == 0
    assert s["digits"]["fleet"] == {"pairs": 0, "disagree": 1, "real_mean_s": None, "sim_mean_s": None,
                                    "error": None}
    assert s["digits"]["ddp"]["error"] == pytest.approx(0.1)


def test_failed_replays_without_times_are_left_out() -> None:
    # calibrate() returns no times when the run had no target (DDP failed): nothing to pair
    s = calibration_summary([{"workload": "tinylm", "error_fleet": None, "error_ddp": None}])
    assert s["tinylm"]["fleet"]["pairs"] == 0
    assert s["tinylm"]["fleet"]["disagree"] == 0
