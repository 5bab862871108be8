"""The benchmarks' arguments: ``--quick`` sets defaults that a flag given explicitly beats, and a bad
value is refused by argparse (exit 2, the value and what is allowed named), never a traceback."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

import pytest

from bench._stats import add_quick, parse_args, positive_int, quick_flags

BENCHES = ["chaos", "codec", "convergence", "e2e", "gap_sweep", "ledger", "load", "merge", "modelsize",
           "scale", "storage"]


def _parse(bench: str, argv: list[str]) -> argparse.Namespace:
    ns: argparse.Namespace = importlib.import_module(f"bench.{bench}").parse(argv)
    return ns


def test_an_explicit_flag_beats_quick_and_quick_beats_the_default() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=positive_int, default=5)
    p.add_argument("--size", default="big")
    add_quick(p, {"reps": 3, "size": "small"}, "small and few")
    assert vars(parse_args(p, [])) == {"reps": 5, "size": "big", "quick": False}
    assert vars(parse_args(p, ["--quick"])) == {"reps": 3, "size": "small", "quick": True}
    assert vars(parse_args(p, ["--quick", "--reps", "5"])) == {"reps": 5, "size": "small", "quick": True}
    assert vars(parse_args(p, ["--reps", "7", "--quick"])) == {"reps": 7, "size": "small", "quick": True}


def test_quick_may_only_name_options_the_parser_has() -> None:
    p = argparse.ArgumentParser()
    add_quick(p, {"repz": 3}, "typo")
    with pytest.raises(ValueError, match="repz"):
        parse_args(p, ["--quick"])


@pytest.mark.parametrize("bench", BENCHES)
def test_in_every_bench_quick_means_its_flags(bench: str) -> None:
    quick: dict[str, Any] = importlib.import_module(f"bench.{bench}").QUICK
    assert vars(_parse(bench, ["--quick"])) == vars(_parse(bench, ["--quick", *quick_flags(quick)]))
    assert vars(_parse(bench, ["--quick"])) == {**vars(_parse(bench, quick_flags(quick))), "quick": True}
    assert _parse(bench, []).quick is False


@pytest.mark.parametrize(("bench", "argv", "dest", "value"), [
    # found by a user: `bench.codec --quick --reps 5` ran 3 repetitions
    ("codec", ["--reps", "5"], "reps", 5),
    ("codec", ["--sizes", "25m"], "sizes", "25m"),
    ("merge", ["--repeats", "7"], "repeats", 7),
    ("merge", ["--sizes", "100"], "sizes", "100"),
    ("e2e", ["--reps", "5"], "reps", 5),
    ("e2e", ["--params", "1000"], "params", 1000),
    ("ledger", ["--reps", "5"], "reps", 5),
    ("ledger", ["--sizes", "3000"], "sizes", [3000]),
    ("load", ["--workers", "200"], "workers", 200),
    ("modelsize", ["--max-size", "1GB"], "max_size", 10**9),
    ("modelsize", ["--reps", "3"], "reps", 3),
    ("scale", ["--workers", "10000"], "workers", "10000"),
    ("scale", ["--rounds", "3"], "rounds", 3),
    ("storage", ["--size-mb", "1"], "size_mb", 1),
    ("storage", ["--reps", "5"], "reps", 5),
    ("chaos", ["--inputs", "50"], "inputs", 50),
    ("chaos", ["--worker-kills", "0"], "worker_kills", 0),
    ("gap_sweep", ["--seeds", "3", "4"], "seeds", [3, 4]),
    ("convergence", ["--sim-workers", "64"], "sim_workers", 64),
    ("convergence", ["--seeds", "0", "1"], "seeds", [0, 1]),
])
def test_an_explicit_flag_wins_over_quick_in_every_bench(bench: str, argv: list[str], dest: str,
                                                         value: Any) -> None:
    for order in (["--quick", *argv], [*argv, "--quick"]):
        assert getattr(_parse(bench, order), dest) == value


@pytest.mark.parametrize(("bench", "argv", "said"), [
    # found by a user: each of these three ended in a traceback
    ("codec", ["--sizes", "7m"], "unknown '7m'; choose from 6m, 25m, 100m"),
    ("gap_sweep", ["--policy", "bogus"], "invalid choice: 'bogus' (choose from 'diloco', 'fedasync'"),
    ("convergence", ["--workers", "0"], "--workers: must be >= 1, got 0"),
    # the same class of problem elsewhere
    ("codec", ["--sizes", "25m,"], "unknown ''; choose from"),
    ("merge", ["--sizes", "2.5"], "--sizes: '2.5' is not a whole number"),
    ("merge", ["--threads", "0"], "--threads: must be >= 1, got 0"),
    ("storage", ["--backends", "local,s4"], "unknown 's4'; choose from local, s3, gcs"),
    ("storage", ["--size-mb", "0"], "--size-mb: must be >= 1, got 0"),
    ("storage", ["--warmup", "-1"], "--warmup: must be >= 0, got -1"),
    ("chaos", ["--only", "chaos,fuz"], "unknown 'fuz'; choose from chaos, fuzz, load, none"),
    ("chaos", ["--worker-kills", "-3"], "--worker-kills: must be >= 0, got -3"),
    ("gap_sweep", ["--param", "lr"], "--param: wants KEY=VALUE, got 'lr'"),
    ("gap_sweep", ["--param", "bogus=1"], "unknown parameter(s) for policy 'vcasgd': bogus"),
    ("gap_sweep", ["--alpha", "1"], "--alpha: must be >= 0 and < 1, got 1"),
    ("gap_sweep", ["--epochs", "0"], "--epochs: must be >= 1, got 0"),
    ("convergence", ["--jobs", "0"], "--jobs: must be >= 1, got 0"),
    ("convergence", ["--sim-workers", "0"], "--sim-workers: must be >= 1, got 0"),
    ("convergence", ["--hours", "-1"], "--hours: must be a finite number > 0, got -1"),
    ("convergence", ["--alpha", "1.5"], "--alpha: must be >= 0 and < 1, got 1.5"),
    # found by QA: a ConfigError traceback, and a --plot refused only after the ~13-minute run
    ("convergence", ["--seeds", "-1", "--no-real", "--quick"], "--seeds: must be >= 0, got -1"),
    ("convergence", ["--plot", "x.txt"], "the file name must end in an image format matplotlib writes"),
    ("convergence", ["--plot", "saving"], "the file name must end in an image format matplotlib writes"),
    ("convergence", ["--plot", "missing/dir/x.png"], "the directory missing/dir does not exist"),
    ("scale", ["--rounds", "0"], "--rounds: must be >= 1, got 0"),
    ("scale", ["--timeout", "0"], "--timeout: must be a finite number > 0, got 0"),
    ("load", ["--connections", "0"], "--connections: must be >= 1, got 0"),
    ("e2e", ["--warmup", "-1"], "--warmup: must be >= 0, got -1"),
    ("e2e", ["--durability", "journal,fsync"], "unknown mode(s) ['fsync']; use none, snapshot, journal"),
    ("modelsize", ["--max-size", "10MB"], "--max-size must be at least 100MB"),
    ("ledger", ["--sizes", "0"], "--sizes: must be >= 1, got 0"),
    # a whole number too large for a float was an OverflowError traceback from the finiteness check
    ("merge", ["--threads", "1" + "0" * 400], "--threads: must be >= 1, got 1000"),
])
def test_a_bad_value_is_an_argparse_error_that_names_it(bench: str, argv: list[str], said: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        importlib.import_module(f"bench.{bench}").main(argv)
    assert info.value.code == 2
    assert said in capsys.readouterr().err


def _row(label: str, connect: str, workers: int, **kw: Any) -> dict[str, Any]:
    row = {"label": label, "connect": connect, "workers": workers, "p50_ms": 1.0, "p99_ms": 2.0,
           "failed": 0, "bytes_per_worker": 10_000.0, "beats_per_core_s": 1000.0, "results_merged": 0,
           "client_lag_ms_p99": 0.5, "heartbeat_p99_ms": 2.0, "lease_p99_ms": 2.0,
           "server_gc_max_ms": 1.0}
    return row | kw


@pytest.mark.parametrize(("workers", "tag"), [("1000,10000", "10k"), ("1000", "1k"), ("2500", "2500")])
def test_scale_names_its_figures_by_the_fleet_it_ran(workers: str, tag: str) -> None:
    import bench.scale as scale

    a = scale.parse(["--workers", workers])
    rows = [_row(r.label, r.connect, r.workers) for r in scale.runs(a)]
    figures = scale.headline(rows)
    for name in ("p99_ms_{}_conn", "p99_ms_{}_tls", "failed_{}", "bytes_per_worker_{}",
                 "bytes_per_worker_{}_vs_bare_aiohttp"):
        assert name.format(tag) in figures
    assert figures["workers"] == max(int(w) for w in workers.split(","))
    other = "1k" if tag != "1k" else "10k"
    assert f"p99_ms_{other}_conn" not in figures


def test_scale_sizes_the_memory_runs_ledger_to_its_fleet() -> None:
    import bench.scale as scale

    runs = {r.label: r for r in scale.runs(scale.parse(["--workers", "1000"]))}
    # a 101,000-unit ledger left freed heap the connections fit in: 102 bytes per worker
    assert scale.units(runs["quiet_1000"]) == scale.units(runs["bare_1000"]) == 2000
    assert scale.units(runs["conn_1000"]) == 101_000           # the merger consumes units


@pytest.mark.parametrize(("bench", "argv", "said"), [
    # found by QA: gap_sweep took any int (--seeds -1: a ConfigError traceback after a minute of
    # rate search), and both benches took a seed twice (--seeds 0 0 0 0 0: five copies of the same
    # simulated cells, "5 of 5 seeds reached" and an interval of width 0)
    ("gap_sweep", ["--seeds", "-1"], "--seeds: must be >= 0, got -1"),
    ("gap_sweep", ["--seeds", "0", "0"], "--seeds: seed 0 given twice"),
    ("convergence", ["--seeds", "1", "0", "1"], "--seeds: seed 1 given twice"),
    ("convergence", ["--seeds", str(2**32)],
     "--seeds: must be < 4,294,967,296 (a 32-bit seed), got 4294967296"),
])
def test_seeds_are_checked_by_the_parser_before_anything_runs(bench: str, argv: list[str], said: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        importlib.import_module(f"bench.{bench}").parse(argv)    # the parser alone: nothing runs
    assert info.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(("bench", "argv", "said"), [
    # found by a review: a list flag took a value twice and ran it twice under the same figure
    # names, the second's figures replacing the first's (`bench.e2e --durability journal,journal`
    # dropped the first coordinator's failures and counted the second's twice in `failed`)
    ("e2e", ["--durability", "journal,snapshot,journal"], "--durability: 'journal' given twice"),
    ("codec", ["--sizes", "6m,6m"], "--sizes: '6m' given twice"),
    ("storage", ["--backends", "local,s3,local"], "--backends: 'local' given twice"),
    ("merge", ["--sizes", "5,05"], "--sizes: 5 given twice"),
    ("scale", ["--workers", "1000,1000"], "--workers: 1000 given twice"),
    ("chaos", ["--only", "fuzz,fuzz"], "--only: 'fuzz' given twice"),
    ("ledger", ["--sizes", "10000", "10000"], "--sizes: 10000 given twice"),
    ("gap_sweep", ["--workloads", "digits", "digits"], "--workloads: 'digits' given twice"),
    ("gap_sweep", ["--epochs", "3", "6", "3"], "--epochs: 3 given twice"),
    ("gap_sweep", ["--alpha", "0.5", "0.50"], "--alpha: 0.5 given twice"),
    ("convergence", ["--workloads", "digits", "digits"], "--workloads: 'digits' given twice"),
    ("convergence", ["--real-rates", "0.3", "0.3"], "--real-rates: 0.3 given twice"),
    ("convergence", ["--step-s", "0.05", "0.05"], "--step-s: 0.05 given twice"),
    ("convergence", ["--alpha", "0.25", "0.25"], "--alpha: 0.25 given twice"),
    ("convergence", ["--replay-records", "r.json", "./r.json"], "--replay-records: "),
    # and a flag the sweep would not use: ignored before, never said
    ("gap_sweep", ["--policy", "diloco", "--alpha", "0.5"], "--policy diloco has no alpha axis"),
    ("gap_sweep", ["--param", "alpha=0.3"], "--param alpha: VC-ASGD's alpha is the sweep's axis"),
    ("gap_sweep", ["--policy", "diloco", "--param", "lr=0.3", "--param", "lr=0.5"],
     "--param: 'lr' given twice"),
])
def test_a_list_flag_takes_each_value_once(bench: str, argv: list[str], said: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        importlib.import_module(f"bench.{bench}").parse(argv)    # the parser alone: nothing runs
    assert info.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(("bench", "argv"), [
    ("e2e", ["--durability", "journal,snapshot,none"]),
    ("merge", ["--sizes", "5,25"]),
    ("gap_sweep", ["--policy", "diloco", "--param", "lr=0.3", "--param", "buffer_size=4"]),
    ("gap_sweep", ["--alpha", "0.25", "0.5", "--epochs", "3", "6"]),
    ("convergence", ["--real-rates", "0", "0.3", "--alpha", "0.25", "0.5"]),
])
def test_distinct_values_still_parse(bench: str, argv: list[str]) -> None:
    importlib.import_module(f"bench.{bench}").parse(argv)
