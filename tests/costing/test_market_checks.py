"""A moving spot price refuses figures that are not finite, naming the one that is wrong (a QA probe
found SpotWalk(sigma=nan) priced every hour at half the list rate without a word)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from vcasync.costing.market import SpotTrace, SpotWalk
from vcasync.errors import ConfigError

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize(("kwargs", "word"), [
    ({"sigma": NAN}, r"SpotWalk.sigma must be a finite number >= 0 \(.*\), got nan"),
    ({"sigma": INF}, "SpotWalk.sigma must be a finite"),
    ({"sigma": -0.1}, "SpotWalk.sigma must be"),
    ({"step_s": NAN}, "SpotWalk.step_s must be a finite number of seconds >= 1"),
    ({"step_s": INF}, "SpotWalk.step_s must be a finite"),
    ({"step_s": 0.0}, "SpotWalk.step_s must be"),
    ({"step_s": 1e-9}, "SpotWalk.step_s must be"),
    ({"high": INF}, r"SpotWalk.high must be a finite factor >= 1 of the list price, got inf"),
    ({"high": NAN}, "SpotWalk.high must be"),
    ({"high": 0.9}, "SpotWalk.high must be"),
    ({"low": NAN}, r"SpotWalk.low must be a finite factor in \(0, 1\]"),
    ({"low": 0.0}, "SpotWalk.low must be"),
    ({"seed": 1.5}, "SpotWalk.seed must be an int"),
])
def test_a_spot_walk_refuses_a_figure_that_is_not_finite_or_out_of_range(kwargs: dict[str, float],
                                                                         word: str) -> None:
    with pytest.raises(ConfigError, match=word):
        SpotWalk(**kwargs)  # type: ignore[arg-type]


def test_a_valid_walk_still_prices() -> None:
    assert SpotWalk(sigma=0.0).usd(0.36, 0, 7200) == pytest.approx(0.72)
    assert SpotWalk(seed=3, step_s=1.0, sigma=0.1, high=3.0).usd(0.36, 0, 60) > 0


@pytest.mark.parametrize(("times", "rates", "word"), [
    ((0.0, NAN), (0.1, 0.2), "trace times must be finite numbers of seconds, got nan"),
    ((NAN,), (0.1,), "trace times must be finite"),
    ((0.0, INF), (0.1, 0.2), "trace times must be finite"),
    ((0.0,), (NAN,), r"trace prices must be finite, from 0 to 10000 \$/h, got nan"),
])
def test_a_spot_trace_refuses_a_time_or_price_that_is_not_finite(times: tuple[float, ...],
                                                                 rates: tuple[float, ...], word: str) -> None:
    with pytest.raises(ConfigError, match=word):
        SpotTrace(times, rates, "t.csv")


@pytest.mark.parametrize("row", ["nan,0.2", "inf,0.2", "60,nan", "60,-inf"])
def test_a_spot_trace_file_names_the_line_of_a_non_finite_cell(tmp_path: Path, row: str) -> None:
    path = tmp_path / "spot.csv"
    path.write_bytes(b"\xef\xbb\xbf" + f"t_s,spot_per_h\n0,0.1\n{row}\n".encode())   # a BOM, as Excel writes
    with pytest.raises(ConfigError, match=r"spot.csv:3: t_s must be a finite number of seconds"):
        SpotTrace.from_csv(path)


def test_a_walk_of_a_huge_sigma_prices_at_its_bounds_not_an_overflow() -> None:
    # math.exp of a step drawn with sigma 1e10 raised OverflowError when the run was priced, after it ran
    walk = SpotWalk(seed=0, step_s=10.0, sigma=1e10)
    usd = walk.usd(0.36, 0.0, 100.0)
    assert 0.5 * 0.36 * 100 / 3600 <= usd <= 2.0 * 0.36 * 100 / 3600
    assert all(walk.factor(k) in (0.5, 2.0) for k in range(1, 10))


def test_a_walk_copied_with_another_seed_draws_its_own_prices() -> None:
    # dataclasses.replace passed the first walk's cache of factors on: seed 8 priced as seed 7
    walk = SpotWalk(seed=7, step_s=10.0, sigma=0.3)
    first = walk.usd(0.36, 0.0, 300.0)
    other = dataclasses.replace(walk, seed=8)
    assert other.usd(0.36, 0.0, 300.0) == SpotWalk(seed=8, step_s=10.0, sigma=0.3).usd(0.36, 0.0, 300.0)
    assert other.usd(0.36, 0.0, 300.0) != first



@pytest.mark.parametrize(("text", "word"), [
    # a field named twice priced at its last cell without a word (a price file refuses it)
    ("t_s,spot_per_h,spot_per_h\n0,0.08,5\n",
     r"spot.csv:1: the header names \['spot_per_h'\] more than once"),
    # a cell past the header's was dropped: "0,0.08,9" read as 0.08 $/h
    ("t_s,spot_per_h\n0,0.08,9\n", "spot.csv:2: the row has more cells than the header"),
    # a finite price no list has: 1e300 $/h gave a saving of -3e300, 1.7e308 a traceback after the run
    ("t_s,spot_per_h\n0,1e300\n", r"spot.csv:2: .*a finite price from 0 to 10000 \$/h"),
    # the row that breaks the order is named, with the time before it
    ("t_s,spot_per_h\n0,0.08\n60,0.1\n30,0.2\n", "spot.csv:4: trace times must increase: t_s 30 after 60"),
    ("t_s,spot_per_h\n0,0.08\n0,0.1\n", "spot.csv:3: trace times must increase: t_s 0 after 0"),
])
def test_a_spot_trace_file_refuses_what_it_would_misread(tmp_path: Path, text: str, word: str) -> None:
    (tmp_path / "spot.csv").write_text(text)
    with pytest.raises(ConfigError, match=word):
        SpotTrace.from_csv(tmp_path / "spot.csv")


def test_a_spot_trace_reads_a_spreadsheets_file(tmp_path: Path) -> None:
    # CRLF line ends, a byte-order mark, spaces after the header's commas, a column of its own
    (tmp_path / "spot.csv").write_bytes(b"\xef\xbb\xbft_s, spot_per_h, zone\r\n0,0.08,a\r\n60,0.16,b\r\n")
    trace = SpotTrace.from_csv(tmp_path / "spot.csv")
    assert (trace.times, trace.rates) == ((0.0, 60.0), (0.08, 0.16))


def test_a_spot_trace_refuses_a_price_above_the_price_tables_cap() -> None:
    with pytest.raises(ConfigError, match=r"trace prices must be finite, from 0 to 10000 \$/h, got 1e\+300"):
        SpotTrace((0.0,), (1e300,))
    assert SpotTrace((0.0,), (10_000.0,)).usd(0.0, 0.0, 3600.0) == pytest.approx(10_000.0)


def test_a_long_walk_is_priced_in_linear_time_with_the_same_prices() -> None:
    """Each step not drawn yet drew every step before it again: pricing N steps took O(N^2), 21 s
    for 4,000 steps (67 minutes of a run at --spot-walk-step 1) on a loaded 2-core machine, and
    hours for a week of 10-s steps, after the run had ended. 20,000 steps took minutes."""
    import time

    walk = SpotWalk(seed=1, step_s=1.0, sigma=0.1)
    t0 = time.monotonic()
    usd = walk.usd(0.3, 0.0, 20_000.0)
    took = time.monotonic() - t0
    assert took < 10.0, f"pricing 20,000 steps took {took:.1f} s"
    assert 0.5 * 0.3 * 20_000 / 3600 <= usd <= 2.0 * 0.3 * 20_000 / 3600
    # the same draws as before, whatever order the steps are asked in (pinned from the old code)
    walk = SpotWalk(seed=3, step_s=10.0, sigma=0.2)
    assert [walk.factor(k) for k in (7, 1, 2, 30, 29)] == pytest.approx(
        [2.0, 1.39536377731, 1.686856209558, 0.860306902707, 1.467647089458], abs=1e-11)
    assert SpotWalk(seed=5, step_s=10.0, sigma=0.3).usd(0.3, 5.0, 1234.5) == pytest.approx(
        0.08889800840546072, rel=1e-12)
