"""Every figure a benchmark prints or saves as a headline carries the min / median / max of its
repetitions beside it (issue 18, "Honest figures"), and a failed repetition stays in that spread.

Quick runs only: tiny models, one or two repetitions, or the figures built from synthetic
repetitions where the bench's own run takes minutes.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest
import torch

import bench.codec as codec
import bench.modelsize as modelsize
import bench.storage as storage


def _strict(line: str) -> Any:
    """JSON as the standard has it: ``Infinity`` and ``NaN`` are refused."""
    def refuse(word: str) -> Any:
        raise ValueError(f"{word} is not JSON")
    return json.loads(line, parse_constant=refuse)


def _is_spread(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 3
            and all(v is None or isinstance(v, int | float) for v in value))


# --- storage ------------------------------------------------------------------------------------

def test_storage_saves_a_spread_beside_every_mb_s_and_overhead(tmp_path: Any) -> None:
    args = storage.parse(["--backends", "local", "--size-mb", "2", "--reps", "2", "--warmup", "0",
                          "--dir", str(tmp_path)])
    args.backends = {"local"}
    figures = asyncio.run(storage.main_async(args))
    for what in ("put", "get", "ref_put", "ref_get"):
        three = figures[f"local_{what}_mb_s_spread"]
        assert _is_spread(three)
        assert three[0] <= figures[f"local_{what}_mb_s"] <= three[2]
    for name in ("local_overhead", "local_put_overhead", "local_get_overhead"):
        assert _is_spread(figures[f"{name}_spread"]), name


def test_storage_a_repetition_where_both_sides_failed_is_infinite_not_nan() -> None:
    """(inf + g) / (inf + rg) - 1 was NaN: a median or min/max over it passed it by."""
    pair = storage.Pair("fake", *(None,) * 6)     # type: ignore[arg-type]
    pair.times = {"put": [1.0, math.inf, 1.0], "get": [1.0, 1.0, 1.0],
                  "ref_put": [1.0, math.inf, 1.0], "ref_get": [1.0, 1.0, 1.0]}
    assert pair.paired() == [0.0, math.inf, 0.0]
    assert pair.paired("put") == [0.0, math.inf, 0.0]
    assert storage.spread(pair.paired()) == [0.0, 0.0, math.inf]
    pair.times["ref_put"] = [1.0, 1.0, math.inf]       # the reference alone failed
    assert pair.paired("put")[2] == -1.0
    assert pair.mb_s("put", storage.MiB) == [1.0, 0.0, 1.0]   # a failed repetition: 0 MB/s, kept


# --- codec --------------------------------------------------------------------------------------

def test_codec_every_timed_ratio_and_the_time_column_carry_a_spread() -> None:
    torch.set_num_threads(1)
    rows: list[Any] = []
    figures: dict[str, Any] = {}
    codec.run_size("tiny", 0.05, 2, rows, figures)
    timed = [k for k in figures if k.endswith("_tiny") and ("_vs_" in k or k.endswith("_gbps_tiny")
                                                             or k.startswith("per_tensor"))]
    assert "raw_vs_torch_save_tiny" in timed
    assert "memcpy_gbps_tiny" in timed
    for k in timed:
        base = k.removesuffix("_tiny")
        if base.endswith("_spread") or figures[k] is None:
            continue
        assert _is_spread(figures[f"{base}_spread_tiny"]), k
    for _, name, secs, _, _, three in rows:
        if math.isfinite(secs):
            assert _is_spread(three), name
            assert three[0] <= three[2], name


# --- modelsize ----------------------------------------------------------------------------------

def _size(params_bytes: int, raw: list[float], bf16: list[float], peaks: list[int]) -> dict[str, Any]:
    return {"bytes": params_bytes, "raw": raw, "bf16": bf16, "rss": 3 * params_bytes,
            "rss_peak": max(peaks) + params_bytes, "rss_peaks": peaks, "stop_failed": 0}


def test_modelsize_linearity_bf16_and_the_peak_carry_spreads_and_a_failed_upload_stays_in_them(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fake = {10**7: _size(10**7, [0.01, 0.02], [0.01, 0.01], [5 * 10**7, 6 * 10**7]),
            10**8: _size(10**8, [0.1, 0.2], [0.08, 0.09], [3 * 10**8, 4 * 10**8]),
            10**9: _size(10**9, [0.8, math.inf], [0.6, 0.7], [4 * 10**9, 5 * 10**9])}
    monkeypatch.setattr(modelsize, "measure_size", lambda size, a: fake[size])
    assert modelsize.main(["--json", "--reps", "2"]) == 0
    figures = _strict(capsys.readouterr().out.splitlines()[-1])   # Infinity was printed as is
    assert figures["failed_1gb"] == 1
    # per repetition: 0.8/0.1 = 8.0 per byte x 1/10, and the failed upload: unbounded, kept
    assert figures["ingest_linearity_spread"] == [0.8, None, None]
    assert figures["ingest_linearity"] is None                  # the median of [0.8, inf]
    assert figures["ingest_linearity_small_spread"] == [1.0, 1.0, 1.0]
    assert figures["bf16_ingest_s_1gb_spread"] == [0.6, 0.65, 0.7]
    assert figures["rss_multiple_max"] == 6.0                   # the run's peak
    assert figures["rss_multiple_max_spread"] == [4.0, 4.5, 5.0]  # each measured upload's own
    assert figures["rss_multiple_100mb_spread"] == [3.0, 3.5, 4.0]
    assert figures["ingest_gbps_100mb_spread"] == [0.5, 0.75, 1.0]
    assert set(figures["centres"]) >= {"ingest_linearity", "rss_multiple_max"}


def test_modelsize_reads_each_measured_uploads_own_peak_from_the_coordinator(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A real coordinator, a tiny model: its peak is reset before each measured upload."""
    args = modelsize.parse(["--warmup", "1", "--held", "0", "--reps", "2"])
    r = modelsize.measure_size(2_000_000, args)
    assert r["rss_peaks"] is not None
    assert len(r["rss_peaks"]) == 2
    assert all(0 < p <= r["rss_peak"] for p in r["rss_peaks"])


# --- e2e ----------------------------------------------------------------------------------------

def test_e2e_headline_raw_tcp_and_throughputs_carry_spreads_and_a_failed_reference_is_counted(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A reference POST that failed made its round's ratio 0, but ``failed`` counted uploads only."""
    import bench.e2e as e2e

    real = e2e.post_once
    calls = {"n": 0}

    async def flaky(*args: Any, **kwargs: Any) -> float:
        calls["n"] += 1
        if calls["n"] == 5:      # round 1's raw POST (round 0 warms the sinks: 4 POSTs)
            raise ConnectionResetError("the sink went away")
        return await real(*args, **kwargs)

    monkeypatch.setattr(e2e, "post_once", flaky)
    assert e2e.main(["--params", "100000", "--reps", "2", "--warmup", "1", "--durability", "journal",
                     "--json"]) == 0
    figures = _strict(capsys.readouterr().out.splitlines()[-1])
    assert figures["failed_reference_journal"] == 1
    assert figures["failed"] == figures["failed_journal"] + 1
    assert figures["e2e_vs_raw_post_min"] == 0.0                 # the failed round, kept
    lo, hi = figures["e2e_vs_raw_tcp_min"], figures["e2e_vs_raw_tcp_max"]
    assert lo <= figures["e2e_vs_raw_tcp"] <= hi
    for name in ("e2e_journal", "raw_post", "whole_buffer_post", "durable_post", "durable_plain_post",
                 "raw_tcp"):
        assert _is_spread(figures[f"{name}_gbps_spread"]), name
    assert figures["raw_post_gbps_spread"][0] == 0.0
    assert _is_spread(figures["loop_stall_ms_p99_spread"])      # each round's own p99
    assert _is_spread(figures["coordinator_cpu_s_per_upload_journal_spread"])
    assert figures["loop_stall_ms_p99_spread"] == figures["loop_stall_ms_p99_journal_spread"]


# --- merge --------------------------------------------------------------------------------------

def test_merge_every_headline_ratio_carries_a_spread(monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.merge as merge

    monkeypatch.setattr(merge, "CASES", [merge.Case("vcasgd", "vcasgd", {"alpha": 0.5}),
                                         merge.Case("sync", "sync", {"buffer_size": 2}, round_size=2)])
    monkeypatch.setattr(merge, "BUILTINS", ["vcasgd", "sync"])
    monkeypatch.setattr(merge, "MIXING", ["vcasgd", "sync"])
    figures = merge.run([1_000_000], repeats=2)
    heads = [k for k in figures if ("_vs_floor" in k or "_vs_memcpy" in k)
             and not k.endswith(("_1m", "_spread")) and "_spread_" not in k]
    assert "vcasgd_vs_memcpy" in heads
    assert "mixing_max_vs_floor" in heads
    for k in heads:
        assert _is_spread(figures[f"{k}_spread"]), k
    worst = figures["mixing_max_policy"]
    assert figures["mixing_max_vs_floor_spread"] == figures[f"{worst}_vs_floor_spread"]
    for k in [k for k in figures if k.endswith("_1m") and ("_vs_" in k) and "_spread_" not in k]:
        assert _is_spread(figures[k.replace("_1m", "_spread_1m")]), k
