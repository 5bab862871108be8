"""bench.gap_sweep's ``--json`` leads with one flat figure per cell, so the benchmarks page can show it."""

from __future__ import annotations

from bench.gap_sweep import flat_figures, seed_spread
from vcasync.costing.spread import spread


def test_each_cell_is_a_figure_with_its_spread_and_reach() -> None:
    gap = spread([1.0, 2.0, 1.5], miss="high", counted="measured").as_dict()
    ratio = spread([1.2, None, None], miss="high").as_dict()
    sweeps = [{"workload": "mnist5000", "cells": [
        {"epochs": 3, "alpha": 0.25, "gap": gap, "reached": 1, "seeds": 3, "samples_ratio": ratio},
        {"epochs": 6, "alpha": None, "gap": spread([None, None], miss="high").as_dict(), "reached": 0,
         "seeds": 2, "samples_ratio": spread([], miss="high").as_dict()}]}]
    assert flat_figures(sweeps) == {
        "gap_mnist5000_3ep_alpha0.25": 1.5, "gap_mnist5000_3ep_alpha0.25_spread": [1.0, 1.5, 2.0],
        "gap_mnist5000_3ep_alpha0.25_reached": "1/3", "samples_ratio_mnist5000_3ep_alpha0.25": 1.2,
        "samples_ratio_mnist5000_3ep_alpha0.25_spread": [1.2, None, None],
        "gap_mnist5000_6ep": None, "gap_mnist5000_6ep_spread": [None, None, None],
        "gap_mnist5000_6ep_reached": "0/2", "samples_ratio_mnist5000_6ep": None,
        "samples_ratio_mnist5000_6ep_spread": None}


def test_a_seed_without_a_value_is_kept_in_the_spread_on_its_side() -> None:
    """The spread was over the seeds with a value only: [1.0, 1.5, 2.0] for 1.0, 2.0 and a seed whose
    fleet ended without a finite quality, a clean range with the worst seed left out."""
    assert seed_spread(spread([1.0, 2.0, None], miss="high").as_dict()) == [1.0, 2.0, None]
    assert seed_spread(spread([1.0, 2.0, None], miss="low").as_dict()) == [None, 1.0, 2.0]
    assert seed_spread(spread([1.0, 2.0, None]).as_dict()) == [None, None, None]   # side unknown
    assert seed_spread({"values": [1.0, 2.0], "missing": 1}) == [None, None, None]
    assert seed_spread(spread([3.0, 1.0, 2.0]).as_dict()) == [1.0, 2.0, 3.0]
