"""bench.convergence's learning-rate search: both sides, chosen on validation, extended past an end."""

from __future__ import annotations

import math

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
