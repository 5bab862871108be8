"""bench.convergence's learning-rate search: both sides, chosen on validation, extended past an end."""

from __future__ import annotations

import math

import pytest

from bench.convergence import best_rate, next_rate


def _rows(*triples: tuple[float, float | None, float | None]) -> list[dict[str, float | None]]:
    return [{"lr": lr, "fleet_validation": f, "sync_validation": s} for lr, f, s in triples]


def test_a_side_best_at_the_lowest_rate_extends_the_grid_downwards() -> None:
    # the 64-worker digits case: synchronous SGD diverged at every rate of the square-root grid
    rows = _rows((0.2, 0.729, 0.188), (0.4, 0.646, 0.111), (0.8, 0.333, 0.083))
    assert next_rate(rows, "accuracy") == 0.1
    rows += _rows((0.1, 0.701, 0.875))
    assert best_rate(rows, "sync_validation", "accuracy") == 0.1
    assert next_rate(rows, "accuracy") == 0.05     # DDP's best is the lowest again: one more
    rows += _rows((0.05, 0.326, 0.59))
    assert next_rate(rows, "accuracy") is None      # both bests inside the grid now


def test_a_best_at_the_highest_rate_extends_upwards_and_loss_is_minimised() -> None:
    rows = _rows((0.001, 2.6, 2.7), (0.002, 2.5, 2.6), (0.004, 2.4, 2.45))
    assert next_rate(rows, "loss") == 0.008
    assert best_rate(rows, "fleet_validation", "loss") == 0.004


def test_missing_and_diverged_scores_never_win() -> None:
    rows = _rows((0.1, math.nan, None), (0.2, 0.9, 0.8), (0.4, math.inf, 0.7))
    assert best_rate(rows, "fleet_validation", "accuracy") == 0.2
    assert best_rate(rows, "sync_validation", "accuracy") == 0.2
    assert next_rate(rows, "accuracy") is None
    assert math.isnan(best_rate(_rows((0.1, None, None)), "sync_validation", "accuracy"))


def test_a_search_over_several_seeds_scores_each_rate_by_its_mean() -> None:
    # real simulations (digits, 2 workers, 1 epoch): every rate is trained once per seed, and the
    # rate a side gets is the best mean, not the best single run
    from bench.convergence import search_lr

    found = search_lr("digits", 2, 1, None, shape={"policy": "vcasgd", "policy_params": {"alpha": 0.5}},
                      seeds=(1000, 1001))
    assert found["seeds"] == [1000, 1001]
    assert found["runs_per_side"] == 2 * len(found["grid"])
    for row in found["grid"]:
        for side in ("fleet", "sync"):
            per_seed = row[f"{side}_validation_per_seed"]
            assert len(per_seed) == 2
            assert math.isclose(row[f"{side}_validation"], sum(per_seed) / 2)
    assert found["lr"] == best_rate(found["grid"], "fleet_validation", "accuracy")
    assert found["sync_lr"] == best_rate(found["grid"], "sync_validation", "accuracy")


def test_a_run_that_collapsed_late_scores_its_collapse_not_its_end() -> None:
    # scoring the final point chose 64 identical workers' synchronous rate 0.1 on digits: its runs
    # rose to 84-89 %, fell to 12-43 % and were climbing back at the end, scoring 90-97 % on the
    # search seeds while 4 of 5 reported seeds ended mid-collapse
    from bench.convergence import search_score
    from vcasync.sim.records import EvalPoint

    def pts(*acc: float) -> list[EvalPoint]:
        return [EvalPoint(float(i), i, i, a, 1.0 / (a + 0.01)) for i, a in enumerate(acc)]

    steady = pts(0.1, 0.3, 0.5, 0.7, 0.8, 0.85, 0.9, 0.91, 0.93)
    assert search_score(steady, "accuracy") == 0.9                  # the worst of the last third
    late_collapse = pts(0.1, 0.3, 0.5, 0.7, 0.85, 0.89, 0.43, 0.12, 0.88)
    assert search_score(late_collapse, "accuracy") == 0.12          # climbed back: still its collapse
    early_dip = pts(0.1, 0.57, 0.43, 0.7, 0.85, 0.89, 0.9, 0.92, 0.93)
    assert search_score(early_dip, "accuracy") == 0.9     # a still-learning run's noise: not held against it
    losses = [EvalPoint(float(i), i, i, 0.0, lo) for i, lo in enumerate((3.0, 2.0, 1.5, 1.2, 2.5, 1.02))]
    assert search_score(losses, "loss") == 2.5
    nan = [EvalPoint(float(i), i, i, 0.0, lo) for i, lo in enumerate((3.0, 1.0, math.nan))]
    assert search_score(nan, "loss") == math.inf
    assert search_score(pts(0.1, 0.5, math.nan), "accuracy") == 0.0


@pytest.mark.slow
def test_the_fleet_is_searched_under_its_cells_preemptions() -> None:
    # the cells' conditions reach every search run: a fleet preempted at 100 %/h on 2 workers
    # scores differently from the same fleet unpreempted, the synchronous side the same
    from bench.convergence import cell_conditions, search_lr

    shape = {"policy": "vcasgd", "policy_params": {"alpha": 0.5}}
    calm = search_lr("digits", 2, 2, None, shape=shape, seeds=(1000,))
    where = cell_conditions("digits", 2, 1.0, epochs=2, hours=5.0, identical=True)
    stormy = search_lr("digits", 2, 2, None, shape=shape, conditions=where, seeds=(1000,))
    by_lr = {r["lr"]: r for r in calm["grid"]}
    common = [r for r in stormy["grid"] if r["lr"] in by_lr]
    assert common
    assert all(r["sync_validation"] == by_lr[r["lr"]]["sync_validation"] for r in common)
    assert any(r["fleet_validation"] != by_lr[r["lr"]]["fleet_validation"] for r in common)


def test_the_synchronous_side_searches_its_batch_and_keeps_the_best_per_rate() -> None:
    # 64 workers x the fleet's 32 a worker on digits is 38 steps of 2,048 samples in 60 epochs
    # (73 % on validation at its best rate; 8 a worker reached 97 %): the search tries smaller
    # per-worker batches for DDP at every rate and names the one it scored
    from bench.convergence import Rates, preempted_fleet, search_lr, sync_batch_of, sync_batches

    assert sync_batches("digits") == (16, 8)
    found = search_lr("digits", 2, 1, None, shape={"policy": "vcasgd", "policy_params": {"alpha": 0.5}},
                      seeds=(1000,), sync_batches=(8,))
    for row in found["grid"]:
        by_batch = row["sync_validation_by_batch"]
        assert set(by_batch) == {"fleet's", "8"}
        assert row["sync_validation"] == max(by_batch.values())
        assert by_batch[str(row["sync_batch_size"] or "fleet's")] == row["sync_validation"]
    assert found["sync_batch_size"] == sync_batch_of(found["grid"], "accuracy")
    cfg = preempted_fleet("digits", 4, 0.3, 0, epochs=1, hours=1.0, identical=True,
                          rates=Rates(0.1, 0.05, 8))
    assert (cfg.lr, cfg.sync_lr, cfg.sync_batch_size) == (0.1, 0.05, 8)


def test_the_fleet_searches_its_batch_first_and_the_cell_runs_at_it() -> None:
    # 64 workers at digits' 32 a worker share 11 units an epoch; at 8 a worker (44 units) every
    # identical-machine seed reached DDP's quality where 4 of 5 had not: the fleet's batch is
    # searched like DDP's, then the rate grid at the batch it chose, DDP keeping all its batches
    from bench.convergence import Rates, preempted_fleet, search_lr

    shape = {"policy": "vcasgd", "policy_params": {"alpha": 0.5}}
    found = search_lr("digits", 2, 1, None, shape=shape, seeds=(1000,), sync_batches=(8,),
                      fleet_batches=(8,))
    tried = found["fleet_batch_search"]
    assert set(tried) == {"32", "8"}
    assert tried["8"]["lr"] == tried["32"]["lr"] / 4              # the linear scaling rule
    assert found["batch_size"] == int(max(tried, key=lambda b: tried[b]["validation"]))
    # the grid is centred on the chosen batch's rate
    assert {r["lr"] for r in found["grid"]} >= {tried[str(found["batch_size"])]["lr"]}
    other = ({32, 8} - {found["batch_size"]}).pop()
    for row in found["grid"]:     # DDP still tries both batches: its own and the fleet's (None)
        assert set(row["sync_validation_by_batch"]) == {"fleet's", str(other)}
    # without fleet_batches nothing changes: the workload's batch, no batch stage
    plain = search_lr("digits", 2, 1, None, shape=shape, seeds=(1000,))
    assert plain["batch_size"] is None
    assert "fleet_batch_search" not in plain
    cfg = preempted_fleet("digits", 4, 0.3, 0, epochs=1, hours=1.0, identical=True,
                          rates=Rates(0.1, 0.05, None, 8))
    assert (cfg.batch_size, cfg.sync_batch_size) == (8, None)
    # a shape that names the batch (a calibration replay's) wins over the search's
    cfg = preempted_fleet("digits", 4, 0.3, 0, epochs=1, hours=1.0, identical=True,
                          rates=Rates(0.1, 0.05, None, 8), batch_size=16)
    assert cfg.batch_size == 16
