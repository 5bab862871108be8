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


@pytest.mark.slow
def test_bench_modelsize_prints_its_figures() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.modelsize", "--quick", "--warmup", "1",
                          "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600, check=True)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert list(figures)[:2] == ["ingest_linearity", "rss_multiple_max"]
    assert figures["largest"] == "100mb"
    assert figures["failed"] == 0
    # at 100 MB against itself the ratio was 1.0 whatever the run did: no figure, a reason instead
    assert figures["ingest_linearity"] is None
    assert "above 100 MB" in figures["reasons"]["ingest_linearity"]
    assert figures["ingest_linearity_small"] > 0
    assert figures["rss_multiple_max"] > 1.0     # the coordinator holds at least the model


def test_bench_modelsize_sizes_parse() -> None:
    from bench.modelsize import parse_size
    assert [parse_size(s) for s in ("10MB", "1GB", "4gb", "0.5GB")] == [10**7, 10**9, 4 * 10**9,
                                                                        5 * 10**8]


@pytest.mark.parametrize("codec", ["raw", "bf16"])
def test_bench_modelsize_encodes_the_payload_whole_as_the_encoder_makes_it(codec: str) -> None:
    """One buffer grown as it is encoded (not the chunks joined: twice the payload at once),
    byte for byte the payload the encoder makes."""
    import torch

    from bench.modelsize import encode_whole
    from vcasync.wire import encode_payload
    tensors = {"w": torch.randn(300_000), "b": torch.randn(7), "n": torch.ones((), dtype=torch.int64)}
    meta = {"lease_id": "x", "base_version": 3}
    data = encode_whole("result", meta, tensors, codec)
    assert isinstance(data, bytearray)
    assert data == b"".join(encode_payload("result", meta, tensors, codec=codec))


def test_bench_modelsize_spools_the_payload_the_encoder_makes(tmp_path: Path) -> None:
    """--spool: the payload is written to a file as it is encoded (the worker's own spool_result)
    and uploaded from it."""
    import asyncio

    import torch

    from bench.modelsize import encode_whole, parse
    from vcasync.worker._io import spool_result
    tensors = {"w": torch.randn(300_000), "n": torch.ones((), dtype=torch.int64)}
    asyncio.run(spool_result(tmp_path / "r", {"lease_id": "x"}, tensors, "raw"))
    assert (tmp_path / "r").read_bytes() == encode_whole("result", {"lease_id": "x"}, tensors, "raw")
    assert parse(["--spool"]).spool
    assert not parse([]).spool


@pytest.mark.slow
def test_bench_ledger_prints_its_figures() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.ledger", "--sizes", "3000", "--reps", "1",
                          "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["snapshot_format"] == 2
    for name in ("capture_ms", "capture_vs_msgpack", "pack_vs_msgpack", "pack_vs_rows",
                 "read_vs_rows", "bytes_per_unit"):
        assert figures[f"{name}_3k"] > 0
        assert len(figures[f"{name}_3k_spread"]) == 3
    assert figures["bytes_vs_rows_3k"] < 1.0        # columns are smaller than rows (bytes: exact)
    # the ledger's own memory a unit: a unit record, a lease and its receipt at the least
    assert 200 < figures["memory_per_unit_3k"] < 100_000


@pytest.mark.parametrize(("bench", "argv", "said"), [
    ("codec", ["--reps", "0"], "--reps: must be >= 1, got 0"),
    ("merge", ["--repeats", "-1"], "--repeats: must be >= 1, got -1"),
    ("scale", ["--workers", "-5"], "--workers: must be >= 1, got -5"),
    ("scale", ["--interval", "0"], "--interval: must be a finite number > 0"),
    ("modelsize", ["--reps", "0"], "--reps: must be >= 1, got 0"),
    ("ledger", ["--reps", "x"], "--reps: 'x' is not a whole number"),
])
def test_a_bench_refuses_counts_that_cannot_make_a_figure(bench: str, argv: list[str], said: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # Found by a user trying the benchmarks: 0 or -1 repetitions ended in "no median for empty
    # data", --workers -5 hung bench.scale, --interval 0 divided by zero.
    import importlib

    with pytest.raises(SystemExit) as info:
        importlib.import_module(f"bench.{bench}").main(argv)
    assert info.value.code == 2
    assert said in capsys.readouterr().err
