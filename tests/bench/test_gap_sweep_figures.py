"""bench.gap_sweep's ``--json`` leads with one flat figure per cell, so the benchmarks page can show it."""

from __future__ import annotations

from bench.gap_sweep import flat_figures


def test_each_cell_is_a_figure_with_its_spread_and_reach() -> None:
    gap = {"mean": 1.5, "ci_low": 0.5, "ci_high": 2.5, "n": 2, "missing": 1, "values": [1.0, 2.0]}
    ratio = {"mean": 1.2, "ci_low": None, "ci_high": None, "n": 1, "missing": 2, "values": [1.2]}
    sweeps = [{"workload": "mnist5000", "cells": [
        {"epochs": 3, "alpha": 0.25, "gap": gap, "reached": 1, "seeds": 3, "samples_ratio": ratio},
        {"epochs": 6, "alpha": None, "gap": {**gap, "mean": None, "values": []}, "reached": 0, "seeds": 3,
         "samples_ratio": {**ratio, "mean": None}}]}]
    assert flat_figures(sweeps) == {
        "gap_mnist5000_3ep_alpha0.25": 1.5, "gap_mnist5000_3ep_alpha0.25_spread": [1.0, 1.5, 2.0],
        "gap_mnist5000_3ep_alpha0.25_reached": "1/3", "samples_ratio_mnist5000_3ep_alpha0.25": 1.2,
        "gap_mnist5000_6ep": None, "gap_mnist5000_6ep_spread": None, "gap_mnist5000_6ep_reached": "0/3",
        "samples_ratio_mnist5000_6ep": None}
