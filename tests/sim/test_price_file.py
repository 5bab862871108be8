"""Price tables: every row has a source and a date, CPU and GPU types per provider, ``--prices FILE``."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from vcasync.cli import ExitCode
from vcasync.costing.prices import PriceTable
from vcasync.errors import ConfigError
from vcasync.sim.cli import configure, run

ROW = {"provider": "acme", "instance": "big-1", "region": "moon-1", "vcpus": 8, "memory_gib": 32.0,
       "on_demand_per_h": 1.0, "spot_per_h": 0.2, "source": "acme price page", "as_of": "2026-11"}


def test_the_built_in_table_names_sources_dates_and_a_cpu_and_a_gpu_type_per_provider() -> None:
    table = PriceTable()
    for provider in ("aws", "gcp", "azure"):
        rows = [table[k] for k in table if table[k].provider == provider]
        assert any(not r.accelerator for r in rows), provider
        assert any(r.accelerator for r in rows), provider
    for key in table:
        row = table[key]
        assert row.source, key
        assert row.as_of, key
        assert 0 < row.spot_per_h < row.on_demand_per_h, key
    assert "paper's era" in table["gcp:n1-standard-8"].note


def test_a_json_or_toml_price_file_adds_and_replaces_rows(tmp_path: Path) -> None:
    js = tmp_path / "p.json"
    own = {**ROW, "provider": "gcp", "instance": "n1-standard-8", "spot_per_h": 0.05, "on_demand_per_h": 0.4}
    js.write_text(json.dumps([ROW, own]))
    table = PriceTable().merged(PriceTable.from_file(js))
    assert table["acme:big-1"].spot_per_h == 0.2
    assert table["gcp:n1-standard-8"].spot_per_h == 0.05
    assert len(table) == len(PriceTable()) + 1
    tm = tmp_path / "p.toml"
    tm.write_text('[[prices]]\nprovider = "acme"\ninstance = "big-1"\nregion = "moon-1"\nvcpus = 8\n'
                  'memory_gib = 32.0\non_demand_per_h = 1.0\nspot_per_h = 0.3\n'
                  'source = "x"\nas_of = "2026"\n')
    assert PriceTable.from_file(tm)["big-1"].spot_per_h == 0.3


def test_a_csv_price_file_reads_like_the_json_rows(tmp_path: Path) -> None:
    # the file a user exports from a spreadsheet or an invoice: a header row, a row per instance
    path = tmp_path / "p.CSV"
    path.write_text("provider,instance,region,vcpus,memory_gib,on_demand_per_h,spot_per_h,source,as_of,"
                    "approximate,min_billed_s,note\n"
                    "acme,big-1,moon-1,8,32,1.0,0.2,acme price page,2026-11,yes,,\n"
                    'acme,big-2,moon-1,16,64,2.0,0.5,"page, p. 2",2026-11,false,0,per second\n')
    table = PriceTable.from_file(path)
    one, two = table["acme:big-1"], table["acme:big-2"]
    assert one == PriceTable.from_rows([{**ROW, "approximate": True}])["acme:big-1"]
    assert one.min_billed_s == 60.0            # an empty cell: the field's default
    assert (two.vcpus, two.source, two.approximate, two.min_billed_s, two.note) == (
        16, "page, p. 2", False, 0.0, "per second")


@pytest.mark.parametrize(("content", "suffix", "word"), [
    (None, ".json", "cannot read"),
    ("{not json", ".json", "not valid"),
    ("[prices", ".toml", "not valid"),
    ("[]", ".json", "non-empty list"),
    (json.dumps({"rows": [ROW]}), ".json", "non-empty list"),
    (json.dumps([{**ROW, "colour": "red"}]), ".json", "unknown field"),
    (json.dumps([{k: v for k, v in ROW.items() if k != "as_of"}]), ".json", "missing field"),
    (json.dumps([{**ROW, "spot_per_h": "cheap"}]), ".json", "must be a number"),
    (json.dumps([{**ROW, "spot_per_h": -1}]), ".json", "finite price"),
    (json.dumps([ROW, ROW]), ".json", "twice"),
    ("provider,instance\n", ".csv", "non-empty list"),
    (",".join(ROW) + "\n" + ",".join(str(v) for v in ROW.values()) + ",extra\n", ".csv", "more cells"),
    (",".join(ROW) + "\n" + ",".join("cheap" if k == "spot_per_h" else str(v) for k, v in ROW.items())
     + "\n", ".csv", "line 2: spot_per_h = 'cheap' is not a number"),
    (",".join([*ROW, "approximate"]) + "\n" + ",".join([*(str(v) for v in ROW.values()), "maybe"]) + "\n",
     ".csv", "approximate = 'maybe' is not a true/false"),
    (",".join(k for k in ROW if k != "vcpus") + "\n"
     + ",".join(str(v) for k, v in ROW.items() if k != "vcpus") + "\n", ".csv",
     r"missing field\(s\) \['vcpus'\]"),
    ("\udcff", ".csv", "cannot read"),
])
def test_a_bad_price_file_is_a_config_error_that_names_it(tmp_path: Path, content: str | None, suffix: str,
                                                           word: str) -> None:
    path = tmp_path / f"prices{suffix}"
    if content is not None:   # a lone surrogate stands for bytes that are not UTF-8
        path.write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.raises(ConfigError, match=word) as info:
        PriceTable.from_file(path)
    assert "prices" in str(info.value)


def test_the_commands_take_prices_file_and_refuse_a_bad_one(tmp_path: Path) -> None:
    good = tmp_path / "p.json"
    good.write_text(json.dumps([ROW]))
    out = subprocess.run([sys.executable, "-m", "vcasync", "simulate", "--prices", str(good), "--list-prices",
                          "--json"], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == ExitCode.OK, out.stderr
    assert any(r["instance"] == "big-1" for r in json.loads(out.stdout))
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    for cmd in (["simulate", "--list-prices"], ["demo", "--no-progress"]):
        out = subprocess.run([sys.executable, "-m", "vcasync", *cmd, "--prices", str(bad)],
                             capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
        assert out.returncode == ExitCode.CONFIG, (cmd, out.stdout, out.stderr)
        assert "bad.json" in out.stderr
        assert not (tmp_path / "runs").exists()  # nothing was started


def test_a_row_listed_twice_is_refused_naming_both_rows(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # found by a capacity planner's probe: a price file with a provider:instance on two rows was
    # refused with "price table lists 'acme:big-1' twice", no line, where every other bad row of the
    # file names its line (docs/headline.md, "Prices, with sources")
    header = ",".join(ROW) + "\n"
    cells = ",".join(str(v) for v in ROW.values()) + "\n"
    other = ",".join("big-2" if k == "instance" else str(v) for k, v in ROW.items()) + "\n"
    path = tmp_path / "mine.csv"
    path.write_text(header + cells + other + cells)
    parser = argparse.ArgumentParser()
    configure(parser)
    assert run(parser.parse_args(["--list-prices", "--prices", str(path)])) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert "mine.csv': line 4 (acme:big-1): listed twice, first on line 2" in err, err
    js = tmp_path / "mine.json"
    js.write_text(json.dumps([ROW, ROW]))
    with pytest.raises(ConfigError, match=r"price row 2 \(acme:big-1\): listed twice, first on price row 1"):
        PriceTable.from_file(js)


@pytest.mark.parametrize(("content", "word"), [
    ("[1, 2]", "must hold a non-empty list of price rows"),
    (json.dumps([{**ROW, "colour": "red"}]), "unknown field"),
    ("\udcff", "not UTF-8 text"),
])
def test_a_bad_price_table_is_refused_as_a_bad_prices_file_is(tmp_path: Path, content: str, word: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    # Found by a tester: simulate --list-prices --price-table FILE holding [1,2] raised TypeError
    # ('int' object is not iterable); --price-table now reads its file as --prices does.
    path = tmp_path / "table.json"
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    parser = argparse.ArgumentParser()
    configure(parser)
    assert run(parser.parse_args(["--list-prices", "--price-table", str(path)])) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert "table.json" in err
    assert word in err


def test_a_price_table_replaces_the_built_in_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "table.json"
    path.write_text(json.dumps([ROW]))
    parser = argparse.ArgumentParser()
    configure(parser)
    assert run(parser.parse_args(["--list-prices", "--json", "--price-table", str(path)])) == ExitCode.OK
    assert [r["instance"] for r in json.loads(capsys.readouterr().out)] == ["big-1"]


def test_a_free_reference_and_an_upside_down_bandwidth_are_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Found by hand: --on-demand-price 0 ran and every saving came out null; a bad
    # --bandwidth-mbps was named by an internal field (bandwidth_min_bps) only.
    from vcasync.cli import main

    assert main(["simulate", "--on-demand-price", "0"]) == 2
    assert "on_demand_per_h must be > 0" in capsys.readouterr().err
    assert main(["simulate", "--bandwidth-mbps", "500", "100"]) == 2
    assert "got 500 100 Mbit/s (--bandwidth-mbps" in capsys.readouterr().err
    free_spot = ["simulate", "--spot-price", "0", "--epochs", "1", "--workers", "2", "--json"]
    assert main(free_spot) == 0                                      # volunteers: fine


def test_a_spot_price_above_on_demand_is_kept_with_a_warning_naming_the_row(
        caplog: pytest.LogCaptureFixture) -> None:
    # accepted silently, it gave a negative saving with nothing said; a user may model a spike on
    # purpose, so it is a warning, not an error
    with caplog.at_level("WARNING", logger="vcasync.costing"):
        table = PriceTable.from_rows([{**ROW, "spot_per_h": 1.5}])
    assert table["acme:big-1"].spot_per_h == 1.5
    assert "price row acme:big-1: spot $1.5/h is above on-demand $1/h" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="vcasync.costing"):
        PriceTable.from_rows([{**ROW, "spot_per_h": 1.0}])                  # equal: no saving, no loss
        PriceTable()
        assert not caplog.text
        PriceTable().with_override("n1-standard-8", spot_per_h=0.5)         # --spot-price too
    assert "price row gcp:n1-standard-8: spot $0.5/h is above on-demand" in caplog.text


def test_list_prices_lines_up_its_columns(capsys: pytest.CaptureFixture[str]) -> None:
    # found by QA: only the instance name was padded (to 14), so "gcp:n1-standard-4+t4" and the
    # azure rows pushed their region and prices right of every other row's
    parser = argparse.ArgumentParser()
    configure(parser)
    assert run(parser.parse_args(["--list-prices"])) == ExitCode.OK
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 10
    assert len({line.index(" on-demand $") for line in lines}) == 1, "\n".join(lines)
