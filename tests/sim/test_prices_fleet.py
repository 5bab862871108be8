"""Price table, fleet draws, preemption models and billing."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest

from vcasync.costing.market import SpotTrace
from vcasync.costing.prices import DEFAULT_INSTANCE, DEFAULT_PRICES, InstancePrice, PriceTable
from vcasync.errors import ConfigError
from vcasync.sim.cost import Billing, ring_allreduce_s
from vcasync.sim.fleet import FleetConfig, Outage, PoissonPreemption, TracePreemption, make_fleet


def test_every_price_names_its_source_and_date_and_spot_is_cheaper() -> None:
    table = PriceTable()
    assert len(table) == len(DEFAULT_PRICES) >= 5
    assert {p.provider for p in DEFAULT_PRICES} >= {"gcp", "aws", "azure"}
    for p in DEFAULT_PRICES:
        assert p.source, p
        assert p.as_of, p
        assert 0 < p.spot_per_h < p.on_demand_per_h, p
    assert not table[DEFAULT_INSTANCE].approximate  # the default is a fixed list price


def test_lookup_by_bare_name_and_clear_errors() -> None:
    table = PriceTable()
    assert table["n1-standard-8"].key == "gcp:n1-standard-8"
    with pytest.raises(ConfigError, match="no price for instance 'x9'"):
        table["x9"]


def test_override_replaces_prices_and_says_so() -> None:
    table = PriceTable().with_override("m5.2xlarge", spot_per_h=0.1)
    p = table["aws:m5.2xlarge"]
    assert p.spot_per_h == 0.1
    assert p.on_demand_per_h == 0.384
    assert p.source == "user override"
    assert "Amazon" in p.note
    assert PriceTable()["aws:m5.2xlarge"].spot_per_h != 0.1  # the original is untouched


def test_bad_prices_are_refused() -> None:
    with pytest.raises(ConfigError, match="on_demand_per_h"):
        InstancePrice("x", "y", "r", 1, 1.0, -1.0, 0.1, "s", "d")
    with pytest.raises(ConfigError, match="unknown field"):
        PriceTable.from_rows([{"provider": "x", "bogus": 1}])
    with pytest.raises(ConfigError, match="twice"):
        PriceTable([DEFAULT_PRICES[0], DEFAULT_PRICES[0]])


def test_billing_is_per_second_after_the_minimum() -> None:
    p = PriceTable()[DEFAULT_INSTANCE]
    assert p.cost(3600.0, spot=False) == pytest.approx(p.on_demand_per_h)
    assert p.cost(3600.0, spot=True) == pytest.approx(p.spot_per_h)
    assert p.cost(10.0, spot=True) == pytest.approx(p.min_billed_s / 3600 * p.spot_per_h)
    b = Billing()
    b.start(0, 0.0)
    b.start(1, 100.0)
    b.stop(0, 1900.0)
    b.stop_all(3700.0)
    assert b.machine_seconds() == pytest.approx(1900.0 + 3600.0)
    assert b.cost(p, spot=True) == pytest.approx((1900 + 3600) / 3600 * p.spot_per_h)
    assert b.machine_seconds(until_s=1000.0) == pytest.approx(1000.0 + 900.0)
    b.start(0, 5000.0)
    with pytest.raises(ValueError, match="already has"):
        b.start(0, 5001.0)


def test_fleet_is_deterministic_per_seed_and_stable_per_slot() -> None:
    cfg = FleetConfig(workers=16)
    assert make_fleet(cfg, 3) == make_fleet(cfg, 3)
    assert make_fleet(cfg, 3) != make_fleet(cfg, 4)
    # Adding workers does not reshuffle the existing ones.
    assert make_fleet(FleetConfig(workers=20), 3)[:16] == make_fleet(cfg, 3)
    same = make_fleet(FleetConfig(workers=4, speed_sigma=0.0, slow_fraction=0.0), 0)
    assert {m.speed for m in same} == {1.0}


def test_poisson_preemption_rate_matches_on_average() -> None:
    model = PoissonPreemption(0.5, restart_delay_s=0.0)
    hours = 0.0
    count = 0
    for slot in range(200):
        for out in model.outages(slot, seed=1):
            if out.down_s > 100 * 3600:
                break
            count += 1
        hours += 100
    assert count / hours == pytest.approx(0.5, rel=0.05)


def test_trace_parses_validates_and_wraps() -> None:
    trace = TracePreemption.parse("worker,down_s,up_s,notice_s\n0,10,20,30\n1,5,6,\n0,30,40,0\n")
    assert list(trace.outages(0, 0)) == [Outage(10, 20, 30), Outage(30, 40, 0)]
    assert list(trace.outages(3, 0)) == list(trace.outages(1, 0))  # slot 3 replays worker 1
    with pytest.raises(ConfigError, match="overlapping"):
        TracePreemption.parse("worker,down_s,up_s\n0,10,20\n0,15,30\n")
    with pytest.raises(ConfigError, match="header"):
        TracePreemption.parse("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="not a number"):
        TracePreemption.parse("worker,down_s,up_s\n0,x,20\n")


def test_a_trace_is_read_as_every_other_csv_input() -> None:
    # found by QA: simulate --trace read its CSV apart from --prices and --spot-trace: a row's extra
    # cell (a notice under a header without notice_s) was dropped without a word, the second of two
    # up_s columns won silently, and a header typed "worker, down_s, up_s" was refused as lacking
    # down_s. Now vcasync.costing.params.csv_records reads all three.
    with pytest.raises(ConfigError, match=r"^t.csv:2: the row has more cells than the header$"):
        TracePreemption.parse("worker,down_s,up_s\n0,100,500,7\n", source="t.csv")
    with pytest.raises(ConfigError, match=r"^t.csv:1: the header names \['up_s'\] more than once"):
        TracePreemption.parse("worker,down_s,up_s,up_s\n0,100,500,900\n", source="t.csv")
    spaced = TracePreemption.parse("worker, down_s, up_s, notice_s\n0,100,500,7\n")
    assert list(spaced.outages(0, 0)) == [Outage(100, 500, 7)]
    with pytest.raises(ConfigError, match=r"^t.csv:3: not a number"):
        TracePreemption.parse("worker,down_s,up_s\n0,10,20\n1,x,30\n", source="t.csv")


BAD_OUTAGE_ROWS = [
    # (the rows after the header's good first row, what the refusal must say: the line and the field)
    ("0,100,50", r"^t.csv:3: worker 0: up_s 50 is before down_s 100"),
    ("0,-100,50", r"^t.csv:3: worker 0: down_s must be >= 0 .*got -100"),
    ("0,100,200,-5", r"^t.csv:3: worker 0: notice_s must be >= 0, got -5"),
    ("0,100,inf", r"^t.csv:3: worker 0: up_s must be a finite number of seconds, got inf"),
    ("-1,100,200", r"^t.csv:3: worker must be a slot index >= 0, got -1"),
    ("0,100", r"^t.csv:3: not a number: up_s missing \(the row is short\)"),
    ("0,100,200,x", r"^t.csv:3: not a number: notice_s = 'x'"),
    ("0,15,30", r"^t.csv: worker 0 has overlapping outages \(10-20 s on line 2 and 15-30 s on line 3\)"),
]


@pytest.mark.parametrize(("row", "said"), BAD_OUTAGE_ROWS, ids=[r for r, _ in BAD_OUTAGE_ROWS])
def test_a_bad_outage_row_is_refused_naming_its_line_and_field(
        row: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # found by a capacity planner's probe: simulate --trace refused a bad row of a long trace with
    # "t.csv: need finite times, 0 <= down_s <= up_s and notice_s >= 0 (worker 0: Outage(down_s=100.0,
    # up_s=50.0, notice_s=0.0))": no line, no field, where --prices and --spot-trace name both
    from vcasync.sim.cli import configure, run

    monkeypatch.chdir(tmp_path)
    Path("t.csv").write_text(f"worker,down_s,up_s,notice_s\n0,10,20,\n{row}\n")
    parser = argparse.ArgumentParser(prog="vcasync simulate")
    configure(parser)
    assert run(parser.parse_args(["--trace", "t.csv", "--workers", "2", "--epochs", "1"])) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vcasync simulate: "), err
    assert re.match(said, err.removeprefix("vcasync simulate: ")), err


def test_a_trace_the_fleet_would_not_replay_is_refused_and_one_it_cuts_short_said(
        caplog: pytest.LogCaptureFixture) -> None:
    # a trace of worker 99 for 2 workers ran with no preemption at all, silently
    from vcasync.sim import SimConfig

    only_99 = TracePreemption.parse("worker,down_s,up_s\n99,10,20\n", source="t.csv")
    with pytest.raises(ConfigError, match=r"t.csv: a fleet of 2 worker\(s\) replays trace workers 0..1.*"
                                          r"only for \[99\]: no preemption would happen"):
        SimConfig(fleet=FleetConfig(workers=2), preemption=only_99)
    SimConfig(fleet=FleetConfig(workers=100), preemption=only_99)        # worker 99 is in this fleet
    some = TracePreemption.parse("worker,down_s,up_s\n0,10,20\n5,10,20\n", source="t.csv")
    with caplog.at_level("WARNING", logger="vcasync.sim"):
        SimConfig(fleet=FleetConfig(workers=2), preemption=some)
    assert "the trace's workers [5] are beyond the fleet's 2 and not replayed" in caplog.text


def test_ring_allreduce_uses_the_slowest_link() -> None:
    assert ring_allreduce_s(1000, 1, [1e9], 0.01) == 0.0
    t = ring_allreduce_s(1_000_000, 4, [1e9, 1e8, 1e9, 1e9], 0.0)
    assert t == pytest.approx(2 * 3 / 4 * 8e6 / 1e8)


@pytest.mark.parametrize(("read", "what"), [(TracePreemption.from_csv, "preemption trace"),
                                            (SpotTrace.from_csv, "spot trace")])
def test_a_trace_file_that_is_not_utf8_is_a_config_error(tmp_path: Path, read: Any, what: str) -> None:
    # Found by a tester: simulate --trace FILE with a non-UTF-8 file raised UnicodeDecodeError, where
    # --prices read the same file cleanly; both now read their files through one function.
    path = tmp_path / "t.csv"
    path.write_bytes(b"worker,down_s,up_s\n0,\xff\xfe,3\n")
    with pytest.raises(ConfigError, match=rf"^cannot read {what} '.*t\.csv': not UTF-8 text$"):
        read(path)
    with pytest.raises(ConfigError, match=rf"^cannot read {what} '.*gone\.csv': No such file"):
        read(tmp_path / "gone.csv")


#: The limits docs/limits.md gives (vcasync.costing.params.MAX_INPUT_FILE_BYTES and _ROWS).
_MAX_BYTES, _MAX_ROWS = 8 * 1024 * 1024, 120_000


def _over_the_byte_limit(path: Path) -> Path:
    """A file one byte over the limit, sparse: nothing of it is written (nor read, now)."""
    with path.open("wb") as f:
        f.truncate(_MAX_BYTES + 1)
    return path


@pytest.mark.parametrize("flag", ["--spot-trace", "--trace", "--prices"])
def test_a_file_over_the_byte_limit_is_refused_by_size_naming_the_file_and_limit(
        flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # found by a review: a 38 MB --spot-trace (or --trace, --prices) file was read whole and parsed
    # into lists several times its size (simulate: 58 s and 720 MB where 13 s and 300 MB without it)
    from vcasync.sim.cli import configure, run

    big = _over_the_byte_limit(tmp_path / "big.csv")
    parser = argparse.ArgumentParser(prog="vcasync simulate")
    configure(parser)
    assert run(parser.parse_args([flag, str(big), "--workers", "2", "--epochs", "1"])) == 2
    err = capsys.readouterr().err
    assert (f"{str(big)!r}: it is 8,388,609 bytes, over the limit of 8,388,608 bytes "
            "(MAX_INPUT_FILE_BYTES)") in err, err


def test_the_demo_refuses_a_spot_trace_or_price_file_over_the_byte_limit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("sklearn", reason="the demo needs scikit-learn (vcasync[demo])")
    from vcasync.cli import main

    big = _over_the_byte_limit(tmp_path / "big.csv")
    for flag in ("--spot-trace", "--prices"):
        # refused while its options are read: no process started, no run directory made
        assert main(["demo", "--quick", "--no-progress", "--run-dir", str(tmp_path / "run"), flag,
                     str(big)]) == 2
        err = capsys.readouterr().err
        assert "it is 8,388,609 bytes, over the limit of 8,388,608 bytes" in err, err
        assert not (tmp_path / "run").exists()


def test_a_file_over_the_row_limit_is_refused_at_the_row_past_it(tmp_path: Path) -> None:
    n = _MAX_ROWS + 1
    spot = tmp_path / "spot.csv"
    spot.write_text("t_s,spot_per_h\n" + "".join(f"{i},1\n" for i in range(n)))
    said = rf"more than {_MAX_ROWS:,} rows, over the limit of {_MAX_ROWS:,}"
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(spot))}:{n + 1}: {said}"):
        SpotTrace.from_csv(spot)
    outages = tmp_path / "outages.csv"
    outages.write_text("worker,down_s,up_s\n" + "".join(f"{i},10,20\n" for i in range(n)))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(outages))}:{n + 1}: {said}"):
        TracePreemption.from_csv(outages)
    rows = tmp_path / "prices.json"
    rows.write_text("[" + ",".join(["{}"] * n) + "]")      # each row refused one by one, before
    with pytest.raises(ConfigError, match=rf"^price file '.*prices\.json': {n:,} price rows: {said}"):
        PriceTable.from_file(rows)


@pytest.mark.parametrize("flag", ["--spot-trace", "--trace", "--prices"])
def test_a_csv_cell_past_pythons_field_limit_is_a_config_error_naming_the_line(
        flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # found while capping these files: a cell over the csv module's 131,072 characters ended
    # simulate --spot-trace and --trace on a "_csv.Error: field larger than field limit" traceback
    from vcasync.sim.cli import configure, run

    bad = tmp_path / "long.csv"
    bad.write_text("t_s,spot_per_h,worker,down_s,up_s\n0,1,0,10,20\n0," + "9" * 200_000 + ",0,10,20\n")
    parser = argparse.ArgumentParser(prog="vcasync simulate")
    configure(parser)
    assert run(parser.parse_args([flag, str(bad), "--workers", "2", "--epochs", "1"])) == 2
    err = capsys.readouterr().err
    assert "3: not valid CSV: field larger than field limit (131072)" in err, err
    assert str(bad) in err, err
