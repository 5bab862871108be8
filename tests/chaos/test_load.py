"""Load while merging (the quick size of ``python -m bench.load``): 1,000 simulated workers lease and
heartbeat against a coordinator process while real results are merged; no lease may expire (the
lease timeout is three heartbeat intervals), no request may fail, in any repetition. Timings are
printed, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_no_lease_expires_wrongly_while_results_are_merged() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.load", "--quick", "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=300, check=True)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["workers"] == 1000
    assert figures["requests"] == 3000                   # every lease and heartbeat answered
    assert figures["errors"] == {}
    assert figures["submit_errors"] == {}
    assert figures["leases_expired"] == 0
    assert figures["merges"] > 10
    assert figures["results_accepted"] == figures["merges"]
    # three repetitions, each in a fresh coordinator: the median with its min / max, failures summed
    assert figures["reps"] == 3
    assert figures["failed_per_rep"] == figures["leases_expired_per_rep"] == [0, 0, 0]
    low, mid, high = figures["p99_ms_spread"]
    assert low <= mid <= high


@pytest.mark.slow
def test_bench_scale_runs_every_connection_mode_and_counts_failures() -> None:
    # A small fleet through every run of bench.scale (pooled, own connections, TLS, quiet, bare
    # aiohttp), both servers under the collector guard: figures come out, nothing fails.
    out = subprocess.run([sys.executable, "-m", "bench.scale", "--workers", "200", "--interval", "1",
                          "--rounds", "1", "--params", "10000", "--reps", "2", "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=600, check=True)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["failed_total"] == 0, out.stdout[:2000]
    for key in ("p99_ms_200_conn", "p99_ms_200_tls", "heartbeats_vs_bare_aiohttp",
                "conn_200_server_gc_max_ms"):
        assert isinstance(figures[key], float), key
    for key in ("p99_ms_200_conn", "p99_ms_200_tls", "heartbeats_vs_bare_aiohttp"):
        assert len(figures[f"{key}_spread"]) == 3, key      # min / median / max over the repetitions
    assert figures["failed_200_per_rep"] == [0, 0]
    # every merging run merged while its fleet ran (the pool and conn runs merged nothing, and
    # counted their merger stopped before it could start as a failure, on a loaded machine)
    for run in ("pool", "conn", "tls"):
        assert figures[f"{run}_200_results_merged"] > 0, run   # the median of the repetitions
