"""Price rows are checked field by field, wherever they come from, and a bad one is named by file,
line (CSV) or row, and field; found by a QA probe of ``--prices`` / ``--price-table`` files."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from vcasync.costing.prices import DEFAULT_COORDINATOR_INSTANCE, InstancePrice, PriceTable
from vcasync.errors import ConfigError
from vcasync.exit_codes import ExitCode
from vcasync.sim.cli import configure, run

ROW: dict[str, object] = {
    "provider": "acme", "instance": "big-8", "region": "eu-1", "vcpus": 8, "memory_gib": 32.0,
    "on_demand_per_h": 0.4, "spot_per_h": 0.09, "source": "acme price page", "as_of": "2026-11"}
HEADER = ",".join(ROW)


def _csv(tmp_path: Path, *cells: dict[str, str], bom: bool = False) -> Path:
    """A CSV price file of ROW's fields, one data line per ``cells`` (overriding ROW's)."""
    names = list(ROW) + sorted({k for c in cells for k in c} - set(ROW))
    lines = [",".join(names)]
    for c in cells:
        lines.append(",".join(c.get(k, str(ROW.get(k, ""))) for k in names))
    path = tmp_path / "prices.csv"
    path.write_bytes(("\ufeff" if bom else "").encode() + ("\n".join(lines) + "\n").encode())
    return path


def _simulate(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    configure(parser)
    return int(run(parser.parse_args(argv)))


# 1. min_billed_s: NaN removed the 60-s minimum (max(uptime, nan) is uptime), inf priced a run at $inf


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_a_min_billed_s_that_is_not_a_finite_number_of_seconds_is_refused(value: float) -> None:
    # one prefix (a new-user probe: "price row 1: price row acme:big-8: ..." said it twice)
    with pytest.raises(ConfigError, match=r"^price row 1 \(acme:big-8\): min_billed_s must be a "
                                          r"finite number of seconds >= 0"):
        PriceTable.from_rows([{**ROW, "min_billed_s": value}])


@pytest.mark.parametrize("text", ["NaN", "Infinity"])
def test_simulate_refuses_a_json_price_file_with_a_non_finite_minimum(
        tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "inf.json"
    path.write_text(json.dumps([ROW])[:-2] + f', "min_billed_s": {text}}}]')
    assert json.loads(path.read_text())[0]["min_billed_s"] != 60      # the file says what it meant
    assert _simulate(["--prices", str(path), "--instance", "acme:big-8", "--workers", "2",
                      "--json"]) == ExitCode.CONFIG
    captured = capsys.readouterr()
    assert "inf.json" in captured.err
    assert "price row 1" in captured.err
    assert "min_billed_s" in captured.err
    assert captured.out == ""


# 2. field types: every field is checked, not only the numbers


@pytest.mark.parametrize(("field", "value", "word"), [
    ("provider", 5, "provider must be a non-empty string, got 5"),
    ("instance", [1], r"instance must be a non-empty string, got \[1\]"),
    ("region", None, "region must be a non-empty string, got None"),
    ("provider", "", "provider must be a non-empty string, got ''"),
    ("instance", " ", "instance must be a non-empty string"),
    ("source", 1.5, "source must be a non-empty string"),
    ("note", 3, "note must be a string"),
    ("vcpus", -8, "vcpus must be a finite number > 0, got -8"),
    ("vcpus", 0, "vcpus must be a finite number > 0"),
    ("vcpus", float("inf"), "vcpus must be a finite number > 0"),
    ("memory_gib", -1, "memory_gib must be a finite number > 0, got -1"),
    ("memory_gib", float("nan"), "memory_gib must be a finite number > 0"),
    ("vcpus", True, "vcpus must be a number, got True"),
    ("on_demand_per_h", 10**400, "on_demand_per_h must be a finite price"),
    ("approximate", "yes", "approximate must be true or false, got 'yes'"),
    ("approximate", 1, "approximate must be true or false, got 1"),
])
def test_a_json_row_with_a_field_of_the_wrong_type_is_refused_naming_row_and_field(
        tmp_path: Path, field: str, value: object, word: str) -> None:
    path = tmp_path / "badtypes.json"
    path.write_text(json.dumps([ROW, {**ROW, "instance": "big-16", field: value}]))
    with pytest.raises(ConfigError, match=word) as info:
        PriceTable.from_file(path)
    assert "badtypes.json" in str(info.value)
    assert "price row 2" in str(info.value)


def test_list_prices_refuses_the_qa_probe_s_bad_types_file_with_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # it was accepted, and --list-prices then crashed with a TypeError formatting the row
    path = tmp_path / "badtypes.json"
    path.write_text(json.dumps([{**ROW, "provider": 5, "instance": [1], "region": None, "vcpus": -8,
                                 "memory_gib": -1}]))
    assert _simulate(["--list-prices", "--prices", str(path)]) == ExitCode.CONFIG
    captured = capsys.readouterr()
    assert "badtypes.json" in captured.err
    assert "price row 1" in captured.err
    assert "provider must be a non-empty string" in captured.err
    assert captured.out == ""


def test_a_row_built_in_code_is_checked_as_a_file_row_is() -> None:
    with pytest.raises(ConfigError, match="approximate must be true or false"):
        InstancePrice("acme", "x", "eu-1", 8, 32.0, 1.0, 0.2, "page", "2026", approximate="no")  # type: ignore[arg-type]
    micro = InstancePrice("gcp", "e2-micro", "us-central1", 0.25, 1.0, 0.008, 0.002, "page", "2026")
    assert micro.vcpus == 0.25


# 3. CSV as spreadsheets write it: a BOM, fractional vCPUs, errors by line


def test_a_csv_file_with_a_byte_order_mark_reads_as_without(tmp_path: Path) -> None:
    # Excel's "CSV UTF-8" starts with a BOM: it was read into the first header, '\ufeffprovider'
    path = _csv(tmp_path, {}, bom=True)
    assert PriceTable.from_file(path)["acme:big-8"] == PriceTable.from_rows([ROW])["acme:big-8"]


def test_a_json_file_with_a_byte_order_mark_reads_as_without(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps([ROW]).encode())
    assert PriceTable.from_file(path)["acme:big-8"].spot_per_h == 0.09


def test_a_csv_header_with_spaces_after_the_commas_names_the_fields(tmp_path: Path) -> None:
    # "provider, instance, region, ..." named every field but the first unknown (' instance', ...)
    path = tmp_path / "prices.csv"
    path.write_text(", ".join(ROW) + "\n" + ",".join(str(v) for v in ROW.values()) + "\n")
    assert PriceTable.from_file(path)["acme:big-8"] == PriceTable.from_rows([ROW])["acme:big-8"]


def test_a_toml_date_for_as_of_reads_as_its_iso_string(tmp_path: Path) -> None:
    # as_of = 2026-11-01 is a TOML date, not a string: it was refused with "as_of must be a
    # non-empty string, got datetime.date(2026, 11, 1)"
    fields = "\n".join(f"{k} = {json.dumps(v)}" for k, v in ROW.items() if k != "as_of")
    path = tmp_path / "prices.toml"
    path.write_text(f"[[prices]]\n{fields}\nas_of = 2026-11-01\n")
    assert PriceTable.from_file(path)["acme:big-8"].as_of == "2026-11-01"
    path.write_text("prices = 5\n")
    with pytest.raises(ConfigError, match="must hold a non-empty list of price rows"):
        PriceTable.from_file(path)


def test_fractional_vcpus_are_accepted_from_csv_and_whole_ones_stay_whole(tmp_path: Path) -> None:
    # GCP's shared-core e2-micro has 0.25 vCPU; '8.5' was refused as "not a number"
    path = _csv(tmp_path, {"instance": "micro", "vcpus": "0.25"}, {"vcpus": "8"})
    table = PriceTable.from_file(path)
    assert table["acme:micro"].vcpus == 0.25
    assert table["acme:big-8"].vcpus == 8
    assert isinstance(table["acme:big-8"].vcpus, int)


def test_a_csv_header_that_names_a_field_twice_is_refused(tmp_path: Path) -> None:
    # found by a probe: "spot_per_h" twice in the header priced the run at the second cell, silently
    path = tmp_path / "prices.csv"
    path.write_text(HEADER + ",spot_per_h\n" + ",".join(str(v) for v in ROW.values()) + ",0.5\n")
    with pytest.raises(ConfigError, match=r"prices.csv': line 1: the header names \['spot_per_h'\] "
                                          r"more than once"):
        PriceTable.from_file(path)


@pytest.mark.parametrize(("cells", "word"), [
    ({"min_billed_s": "nan"},
     r"line 3 \(acme:big-16\): min_billed_s must be a finite number of seconds"),
    ({"min_billed_s": "inf"}, "line 3 .*min_billed_s must be a finite"),
    ({"vcpus": "-8"}, "line 3 .*vcpus must be a finite number > 0"),
    ({"vcpus": "eight"}, "line 3: vcpus = 'eight' is not a number"),
    ({"approximate": "maybe"}, "line 3: approximate = 'maybe' is not a true/false value"),
    ({"approximate": "on"}, "line 3: approximate = 'on' is not a true/false value"),
    ({"colour": "red"}, r"line 3: unknown field\(s\) \['colour'\]"),
])
def test_a_bad_csv_row_is_named_by_its_line_in_the_file(tmp_path: Path, cells: dict[str, str],
                                                         word: str) -> None:
    path = _csv(tmp_path, {}, {"instance": "big-16", **cells})
    with pytest.raises(ConfigError, match=word) as info:
        PriceTable.from_file(path)
    assert "prices.csv" in str(info.value)
    assert "price row 0" not in str(info.value)
    assert "price row 1:" not in str(info.value)
    assert str(info.value).count("price row") == 0


@pytest.mark.parametrize(("cell", "value"), [("true", True), ("YES", True), ("1", True), ("false", False),
                                             ("no", False), ("0", False)])
def test_a_csv_true_false_cell_reads_the_documented_words(tmp_path: Path, cell: str, value: bool) -> None:
    path = _csv(tmp_path, {"approximate": cell})
    assert PriceTable.from_file(path)["acme:big-8"].approximate is value


# 4. a table without the coordinator's (default) instance says so and names the flag


def test_a_table_without_the_coordinator_s_instance_says_whose_it_is_and_how_to_choose(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=r"coordinator's instance .*--coordinator-instance"):
        PriceTable.from_rows([ROW]).resolve(DEFAULT_COORDINATOR_INSTANCE)
    path = tmp_path / "table.json"
    path.write_text(json.dumps([ROW]))
    argv = ["--price-table", str(path), "--instance", "acme:big-8", "--workers", "2"]
    assert _simulate(argv) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert DEFAULT_COORDINATOR_INSTANCE in err
    assert "--coordinator-instance" in err


# found by a new-user probe: a finite 1e308 passed, and the text summary printed a 300-digit cost,
# "coordinator $inf" and "saving nan %"
@pytest.mark.parametrize(("field", "value", "word"), [
    ("on_demand_per_h", 1e308, r"on_demand_per_h must be a finite price >= 0 and <= 10,000, got 1e\+308"),
    ("spot_per_h", 10_000.01, "spot_per_h must be a finite price >= 0 and <= 10,000"),
    ("min_billed_s", 1e308, "min_billed_s must be a finite number of seconds >= 0 and <= 86,400"),
])
def test_a_huge_but_finite_price_or_minimum_is_refused(field: str, value: float, word: str) -> None:
    with pytest.raises(ConfigError, match=word):
        PriceTable.from_rows([{**ROW, field: value}])
    PriceTable.from_rows([{**ROW, "on_demand_per_h": 10_000, "spot_per_h": 10_000,
                           "min_billed_s": 86_400}])    # the bounds themselves are prices


def test_simulate_refuses_the_probe_s_huge_csv_row_with_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _csv(tmp_path, {"on_demand_per_h": "1e308", "min_billed_s": "1e308"})
    assert _simulate(["--workers", "2", "--epochs", "1", "--shards", "2", "--identical", "--prices",
                      str(path), "--instance", "acme:big-8",
                      "--coordinator-instance", "acme:big-8"]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert "line 2 (acme:big-8): on_demand_per_h must be a finite price >= 0 and <= 10,000" in err


def test_a_bad_row_carries_its_key_and_problem_and_the_loader_adds_only_the_place() -> None:
    # the loader stripped InstancePrice's own "price row KEY: " prefix by matching the message's
    # text to avoid a doubled prefix; the row error now carries its parts and the message is
    # built once, by the error
    from vcasync.errors import PriceRowError
    with pytest.raises(PriceRowError) as built:
        InstancePrice(**{**ROW, "vcpus": -1})  # type: ignore[arg-type]
    assert (built.value.key, built.value.where) == ("acme:big-8", None)
    assert built.value.problem.startswith("vcpus must be a finite number > 0")
    assert str(built.value) == f"price row acme:big-8: {built.value.problem}"
    with pytest.raises(PriceRowError) as loaded:
        PriceTable.from_rows([ROW, {**ROW, "instance": "big-9", "vcpus": -1}])
    assert (loaded.value.key, loaded.value.where, loaded.value.problem) == (
        "acme:big-9", "price row 2", built.value.problem)
    assert str(loaded.value) == f"price row 2 (acme:big-9): {built.value.problem}"
    # a row not yet named by provider:instance, or refused before it is built: the place alone
    with pytest.raises(PriceRowError, match=r"^price row 1: provider must be a non-empty string") as no_key:
        PriceTable.from_rows([{**ROW, "provider": " "}])
    assert no_key.value.key is None
    with pytest.raises(PriceRowError, match=r"^price row 1: missing field\(s\) \['region'\]"):
        PriceTable.from_rows([{k: v for k, v in ROW.items() if k != "region"}])
