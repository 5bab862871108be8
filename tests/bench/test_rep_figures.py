"""bench.scale and bench.load repeat their runs: each figure is the median of its repetitions with
``NAME_spread`` (``[min, median, max]``) beside the headline ones, failures are summed over every
repetition (each repetition's count beside the headline's), never dropped."""

from __future__ import annotations

from typing import Any

import pytest

from bench._stats import over_reps


def test_over_reps_sums_counts_and_takes_the_median_of_the_rest() -> None:
    reps = [{"p99": 3.0, "failed": 0, "errors": {"timeout": 1}, "workers": 10, "mode": "x", "ratio": 1.0},
            {"p99": 1.0, "failed": 2, "errors": {"timeout": 2, "reset": 1}, "workers": 10, "mode": "x",
             "ratio": None},
            {"p99": 2.0, "failed": 1, "errors": {}, "workers": 10, "mode": "y", "ratio": 2.0}]
    got = over_reps(reps, ["p99", "failed", "ratio"], lambda k: k == "failed")
    assert got == {"p99": 2.0, "p99_spread": [1.0, 2.0, 3.0],
                   "failed": 3, "failed_per_rep": [0, 2, 1],
                   "errors": {"timeout": 3, "reset": 1}, "workers": 10, "mode": ["x", "x", "y"],
                   # a repetition that gave none is not dropped: the figure is not measured
                   "ratio": None, "ratio_spread": None, "reps": 3,
                   "reasons": {"ratio": "not measured: repetition(s) 2 of 3 gave none"}}
    with pytest.raises(ValueError, match="no repetitions"):
        over_reps([], [], lambda k: False)


def _row(label: str, connect: str, workers: int, rep: int) -> dict[str, Any]:
    return {"label": label, "connect": connect, "workers": workers, "p50_ms": 1.0, "p99_ms": 2.0 + rep,
            "failed": rep if connect == "tls" else 0, "bytes_per_worker": 10_000.0 + 100 * rep,
            "beats_per_core_s": 1000.0 * (2 if label.startswith("bare") else 1 + rep / 10),
            "results_merged": 5, "client_lag_ms_p99": 0.5, "heartbeat_p99_ms": 2.0,
            "lease_p99_ms": 2.0, "server_gc_max_ms": 1.0}


def test_scale_gives_every_headline_figure_over_its_repetitions() -> None:
    import bench.scale as scale

    a = scale.parse(["--reps", "3"])
    assert a.reps == 3
    assert scale.parse(["--quick"]).reps == 2
    per_rep = [scale.headline([_row(r.label, r.connect, r.workers, rep) for r in scale.runs(a)])
               for rep in (2, 0, 1)]
    figures = scale.summarise(per_rep)
    # the names issue 18 asks for hold the median; the spread is beside them
    assert figures["p99_ms_10k_conn"] == 3.0
    assert figures["p99_ms_10k_conn_spread"] == [2.0, 3.0, 4.0]
    assert figures["p99_ms_10k_tls_spread"] == [2.0, 3.0, 4.0]
    assert figures["bytes_per_worker_10k_spread"] == [10_000.0, 10_100.0, 10_200.0]
    assert figures["heartbeats_vs_bare_aiohttp_spread"] == [0.5, 0.55, 0.6]   # paired per repetition
    assert figures["bytes_per_worker_10k_vs_bare_aiohttp_spread"] == [1.0, 1.0, 1.0]
    assert figures["p99_ms_1k_spread"] == [2.0, 3.0, 4.0]
    # failures: summed over the repetitions, never a median
    assert figures["failed_10k"] == 3
    assert figures["failed_10k_per_rep"] == [2, 0, 1]
    assert figures["failed_total"] == 3
    assert figures["tls_10000_failed"] == 3
    assert figures["workers"] == 10_000
    assert figures["reps"] == 3
    # a single run's figures are medians, without a spread of their own
    assert figures["conn_10000_p99_ms"] == 3.0
    assert "conn_10000_p99_ms_spread" not in figures


def _load_row(rep: int, failed: int) -> dict[str, Any]:
    return {"workers": 100, "requests": 300, "errors": {"timeout": failed} if failed else {},
            "submit_errors": {"submit: rejected too_stale": 1} if rep == 1 else {},
            "failed": failed + (rep == 1), "p50_ms": 1.0 + rep, "p99_ms": 5.0 + rep,
            "heartbeat_p99_ms": 4.0, "client_lag_ms_p99": 1.0, "merges": 10 * rep,
            "results_accepted": 10 * rep, "merges_per_s": 10.0 * rep, "leases_expired": rep % 2,
            "bytes_per_worker": 3000.0}


def test_load_gives_its_figures_over_its_repetitions() -> None:
    import bench.load as load

    assert load.parse([]).reps == 5
    assert load.parse(["--quick"]).reps == 3
    figures = load.summarise([_load_row(1, 0), _load_row(3, 2), _load_row(2, 0)])
    assert list(figures)[:2] == ["p99_ms", "p99_ms_spread"]
    assert figures["p99_ms"] == 7.0
    assert figures["p99_ms_spread"] == [6.0, 7.0, 8.0]
    assert figures["merges_per_s_spread"] == [10.0, 20.0, 30.0]
    assert figures["failed"] == 3
    assert figures["failed_per_rep"] == [1, 2, 0]
    assert figures["leases_expired"] == 2
    assert figures["leases_expired_per_rep"] == [1, 1, 0]
    assert figures["errors"] == {"timeout": 2}
    assert figures["submit_errors"] == {"submit: rejected too_stale": 1}
