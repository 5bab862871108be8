"""bench.convergence's calibration summary: the seeds' mean against the replays' mean, per side, and
the seeds where only the run or only its replay reached the target counted, not dropped."""

from __future__ import annotations

from typing import Any

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


# One digits run's measurements (seed 1 of the default run of 2026-12-05), without preemptions.
_MEASURED = {"sample_cost_s": 1.4e-4, "sample_cpu_s": 7.1e-5, "unit_overhead_s": 0.033,
             "unit_cpu_s": 0.009, "boot_s": 6.64, "first_unit_extra_s": 2.03, "ddp_step_s": 0.0136,
             "ddp_first_step_s": 7.69, "first_worker_s": 1.45, "unit_steps": 6, "shards": 8,
             "epochs": 4, "batch_size": 32, "lr": 0.1, "sync_lr": 0.1, "last_merge_s": 28.4,
             "runnable_fleet": 2.82, "runnable_ddp": 3.65, "merge_interval_s": 0.13,
             "merge_s": 0.0004, "coordinator_cpu_per_result_s": 0.0067, "outages": {}}


def _replay(ddp_step_s: float) -> dict[str, object]:
    from bench.convergence import calibrate
    real = {"measured": {**_MEASURED, "ddp_step_s": ddp_step_s},
            "report": {"metric": "accuracy", "time_to_target_s": 10.6, "ddp_time_to_target_s": 8.8,
                       "cost": {"target": {"value": 0.90, "reference": 0.95}}}}
    return calibrate(real, "digits", 4, 1, cores=2.0)


@pytest.mark.slow
def test_the_ddp_replay_runs_on_ddps_measured_step() -> None:
    # DDP's replay is its own training at its measured start-up and step: doubling the step
    # doubles the training part of its time to target. The step the CPU model alone gives (the
    # fleet's CPU per sample, stretched) is reported beside it, not used.
    one, two = _replay(0.0136), _replay(0.0272)
    first = _MEASURED["ddp_first_step_s"]
    assert one["sim_ddp_s"] is not None
    assert two["sim_ddp_s"] - first == pytest.approx(2 * (one["sim_ddp_s"] - first))
    assert one["error_ddp"] == pytest.approx(abs(one["sim_ddp_s"] - 8.8) / 8.8)
    assert one["error_ddp_cpu_only"] is not None
    assert one["error_ddp_cpu_only"] == two["error_ddp_cpu_only"]   # the step it ignores


def test_a_seed_only_one_side_reached_leaves_the_per_seed_error_unbounded_not_the_agreeing_max() -> None:
    # mnist5000 on 2026-12-05: 0.109 over four seeds was published as sim_vs_real_error (within the
    # 20 % target) while the fifth seed's replay reached the target its real run missed
    from bench.convergence import per_seed_error

    assert per_seed_error([0.05, 0.109], 0) == (0.109, None)
    assert per_seed_error([], 0) == (None, None)
    value, why = per_seed_error([0.05, 0.109], 1)
    assert value is None
    assert why == ("unbounded: in 1 seed(s) only one of the run and its replay reached the target; "
                   "the largest error over the seeds where both did: 0.109")
    assert per_seed_error([], 2) == (None, "unbounded: in 2 seed(s) only one of the run and its replay "
                                           "reached the target")


def test_a_seed_whose_fleet_and_ddp_replays_both_disagree_is_one_seed_not_two() -> None:
    # found by QA: `python -m bench.convergence --quick` (seeds [0]) said "2 seeds where only one
    # side reached the target" and "unbounded: in 2 seed(s)": the count was of sides (the fleet's
    # and DDP's replay of seed 0 both missed what their runs reached), summed over the two
    from bench.convergence import calibration_figures

    one = [{**_cal("digits", (61.4, None), (27.3, None)), "seed": 0}]
    f = calibration_figures(one)
    assert f["sim_vs_real_disagree"] == 1
    assert f["why"] == "unbounded: in 1 seed(s) only one of the run and its replay reached the target"
    # per side, each side's own count is unchanged
    assert f["calibration_summary"]["digits"]["fleet"]["disagree"] == 1
    assert f["calibration_summary"]["digits"]["ddp"]["disagree"] == 1
    # two seeds, one side each; and a seed of another workload with the same number is another seed
    two = [{**_cal("digits", (10.0, None), (5.0, 5.5)), "seed": 0},
           {**_cal("digits", (9.0, 9.5), (None, 5.0)), "seed": 1},
           {**_cal("mnist5000", (20.0, None), (15.0, 15.5)), "seed": 0}]
    assert calibration_figures(two)["sim_vs_real_disagree"] == 3


def _report(fleet_s: float | None, ddp_s: float | None, saving: float | None = 0.7,
            sigterm: int = 5, sigkill: int = 1) -> dict[str, Any]:
    return {"time_to_target_s": fleet_s, "ddp_time_to_target_s": ddp_s, "saving": saving,
            "recovery": {"sigterm": sigterm, "sigkill": sigkill}}


def test_a_seeds_repeat_is_measured_against_its_first_run_by_the_per_seed_rule() -> None:
    # --real-repeats: the floor under sim_vs_real_error is the same rule with the seed's own second
    # run in the replay's place; a repeat that missed what its first run reached leaves it unbounded
    from bench.convergence import repeat_figures

    pairs = [{"workload": "digits", "seed": 0, "repeat": 1,
              "first": _report(10.0, 8.0), "again": _report(13.0, 8.4, saving=0.6, sigterm=4)},
             {"workload": "digits", "seed": 1, "repeat": 1,
              "first": _report(20.0, 9.0), "again": _report(15.0, 9.0)}]
    f = repeat_figures(pairs)
    assert f["real_vs_real_error"] == pytest.approx(0.3)        # seed 0's fleet: 13 against 10
    assert f["real_vs_real_error_fleet"] == pytest.approx(0.3)
    assert f["real_vs_real_disagree"] == 0
    assert f["why"] is None
    row = f["real_repeats"][0]
    assert row["fleet_s"] == [10.0, 13.0]
    assert row["ddp_s"] == [8.0, 8.4]
    assert row["error_ddp"] == pytest.approx(0.05)
    assert row["saving"] == [0.7, 0.6]
    assert row["preemptions"] == [6, 5]
    assert f["real_repeats"][1]["error_fleet"] == pytest.approx(0.25)

    missed = repeat_figures([*pairs, {"workload": "digits", "seed": 2, "repeat": 1,
                                      "first": _report(11.0, 8.0), "again": _report(None, 8.1, saving=None)}])
    assert missed["real_vs_real_error"] is None
    assert missed["real_vs_real_error_both_reached"] == pytest.approx(0.3)
    assert missed["real_vs_real_disagree"] == 1
    assert missed["why"] == ("unbounded: in 1 seed(s) only one of the run and its repeat reached the "
                             "target; the largest error over the seeds where both did: 0.300")
    # the seeds' means: fleet 15 against 14 (1/15), DDP 8.5 against 8.7 (0.2/8.5)
    assert f["real_vs_real_error_mean"] == pytest.approx(1 / 15)
    fleet = f["real_vs_real_summary"]["digits"]["fleet"]
    assert fleet == {"pairs": 2, "disagree": 0, "first_mean_s": 15.0, "repeat_mean_s": 14.0,
                     "error": pytest.approx(1 / 15)}
    assert f["real_vs_real_summary"]["digits"]["ddp"]["error"] == pytest.approx(0.2 / 8.5)
    # a seed only one run reached is counted in the means' disagree, never in their pairs
    assert missed["real_vs_real_summary"]["digits"]["fleet"]["pairs"] == 2
    assert missed["real_vs_real_summary"]["digits"]["fleet"]["disagree"] == 1
    assert repeat_figures([]) == {"real_vs_real_error": None, "real_vs_real_error_both_reached": None,
                                  "real_vs_real_error_fleet": None, "real_vs_real_error_mean": None,
                                  "real_vs_real_disagree": 0, "real_vs_real_summary": {},
                                  "real_repeats": [], "why": None}
