"""The storage benchmark runs end to end (tiny size, every backend) and prints its figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_storage_prints_its_figures() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.storage", "--size-mb", "1", "--reps", "1",
                          "--warmup", "0", "--json"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, check=True)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert list(figures)[:3] == ["local_overhead", "s3_overhead", "gcs_overhead"]
    assert all(isinstance(figures[k], float) for k in ("local_overhead", "s3_overhead", "gcs_overhead"))
    assert "overhead" in out.stdout
