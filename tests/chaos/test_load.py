"""Load while merging (the quick size of ``python -m bench.load``): 1,000 simulated workers lease and
heartbeat against a coordinator process while real results are merged; no lease may expire (the
lease timeout is three heartbeat intervals), no request may fail. Timings are printed, never
asserted."""

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
