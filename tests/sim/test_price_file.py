"""Price tables: every row has a source and a date, CPU and GPU types per provider, ``--prices FILE``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vcasync.cli import ExitCode
from vcasync.costing.prices import PriceTable
from vcasync.errors import ConfigError

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
])
def test_a_bad_price_file_is_a_config_error_that_names_it(tmp_path: Path, content: str | None, suffix: str,
                                                           word: str) -> None:
    path = tmp_path / f"prices{suffix}"
    if content is not None:
        path.write_text(content)
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
