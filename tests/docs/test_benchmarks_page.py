"""docs/benchmarks.md is what ``python -m bench.publish`` renders from the saved figures, and it
names every figure issue 18 asks for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.publish import BENCHES, ISSUE_18, PAGE, SIMULATED, load_results, main, render


def test_the_page_is_in_sync_with_the_saved_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--check"]) == 0, "run: python -m bench.publish\n" + capsys.readouterr().out


def test_every_figure_issue_18_names_is_on_the_page() -> None:
    page = PAGE.read_text()
    missing = [n for names in ISSUE_18.values() for n in names if f"`{n}`" not in page]
    assert missing == []
    assert set(ISSUE_18) <= set(BENCHES)


def test_figures_of_simulated_fleets_are_marked_so() -> None:
    """Found by a probe: the table gave saving_sim_64, saving_same_machines and
    adaptive_gap_mnist_50 like the real runs' figures; docs/headline.md marks them simulated."""
    table = PAGE.read_text().split("## Figures issue 18 asks for")[1].split("\n## ")[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    for figure in ("saving_sim_64", "saving_same_machines", "adaptive_gap_mnist_50"):
        assert figure in SIMULATED
        shown = [r for r in rows if f" | `{figure}`" in r]
        assert shown
        assert all(f"`{figure}` *(simulated)*" in r for r in shown), shown
    real = [r for r in rows if " | `saving_real` | " in r]
    assert real


def test_render_is_deterministic_and_shows_spreads_and_the_machine(tmp_path: Path) -> None:
    (tmp_path / "machine.json").write_text(json.dumps({"cpu": "Test CPU", "cores": 2}))
    figures = {"vcasgd_vs_floor": 1.1, "vcasgd_vs_floor_spread": [1.0, 1.1, 1.3], "failed": 0}
    (tmp_path / "merge.json").write_text(json.dumps({"command": "python -m bench.merge --json",
                                                     "seconds": 1.0, "figures": figures}))
    page = render(*load_results(tmp_path))
    assert page == render(*load_results(tmp_path))
    assert "| `merge` | `vcasgd_vs_floor` | median 1.1 (min-max 1-1.3 over repetitions) |" in page
    assert "| cpu | Test CPU |" in page
    assert "| `codec` | `raw_vs_memcpy_25m` | not measured |" in page


def _save(directory: Path, name: str, result: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.json").write_text(json.dumps(result))


def test_each_result_shows_when_and_at_which_commit_and_where_it_was_measured(tmp_path: Path) -> None:
    where = {"cpu": "Test CPU", "cores": 2}
    _save(tmp_path, "merge", {"command": "python -m bench.merge --json", "quick": False, "seconds": 1.0,
                              "measured": {"date": "2026-12-06 10:00 UTC", "commit": "abcdef1234567",
                                           "dirty": True, "load_average_at_start": 0.5},
                              "machine": where, "figures": {"vcasgd_vs_floor": 1.1, "failed": 0}})
    _save(tmp_path, "codec", {"command": "python -m bench.codec --sizes 25m --reps 3 --json", "quick": True,
                              "seconds": 2.0, "measured": {"date": "2026-12-06 11:00 UTC",
                                                           "commit": "0123456789ab", "dirty": False},
                              "machine": {**where, "cores": 4}, "figures": {"raw_vs_memcpy_25m": 0.5}})
    page = render(*load_results(tmp_path, root=tmp_path))
    assert ("| `merge` | default | 2026-12-06 10:00 UTC | `abcdef1234` (uncommitted changes) | B | 0.5 |"
            in page)
    assert "| `codec` | **quick** | 2026-12-06 11:00 UTC | `0123456789` | A |  |" in page
    assert "Machine A (`codec`)" in page                    # machines in the page's bench order
    assert "Machine B (`merge`)" in page
    assert "| `codec` | `raw_vs_memcpy_25m` | 0.5 (quick) |" in page
    assert "at the **quick** sizes, not the default configuration" in page
    assert "| `storage` | not measured | | | | |" in page


def test_a_bench_that_saves_its_own_figures_is_published_and_a_quick_run_does_not_displace_it(
        tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    long_run = {"worker_kills": 100, "results_lost": 0, "mode": "long", "date": "2026-12-03 15:40 UTC",
                "machine": "x86_64, 2 cores, 3.11.7", "total_seconds": 755.6}
    (tmp_path / "docs" / "reliability.json").write_text(json.dumps(long_run))
    results = tmp_path / "results"
    _save(results, "chaos", {"command": "python -m bench.chaos --quick --json", "quick": True, "seconds": 9,
                             "measured": {"date": "2026-12-07 09:00 UTC", "commit": "feed", "dirty": False},
                             "figures": {"worker_kills": 12, "mode": "quick"}})
    _, saved = load_results(results, root=tmp_path)
    assert saved["chaos"]["figures"]["worker_kills"] == 100
    page = render({}, saved)
    assert "| `chaos` | `worker_kills` | 100 |" in page
    assert "from `docs/reliability.json`" in page
    assert "before it recorded the commit" in page
    # a later long run saved by publish wins over the older one
    _save(results, "chaos", {"command": "python -m bench.chaos --json", "quick": False, "seconds": 700,
                             "measured": {"date": "2026-12-08 09:00 UTC", "commit": "beef", "dirty": False},
                             "figures": {"worker_kills": 99, "mode": "long"}})
    assert load_results(results, root=tmp_path)[1]["chaos"]["figures"]["worker_kills"] == 99


def test_storage_convergence_and_chaos_are_published_benches() -> None:
    assert {"storage", "convergence", "chaos", "gap_sweep", "load"} <= set(BENCHES)
    page = PAGE.read_text()
    for bench in ("storage", "convergence", "chaos", "gap_sweep", "load"):
        assert f"## `bench.{bench}`" in page


def test_provenance_names_the_commit_and_whether_the_tree_was_dirty(tmp_path: Path) -> None:
    import subprocess

    from bench.publish import provenance

    assert provenance(tmp_path)["commit"] is None           # not a git checkout: not recorded
    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=tmp_path,
                       check=True, capture_output=True)
    git("init", "-q")
    (tmp_path / "f.txt").write_text("a")
    git("add", "f.txt")
    git("commit", "-q", "-m", "one")
    clean = provenance(tmp_path)
    assert len(clean["commit"]) == 40
    assert clean["dirty"] is False
    assert clean["date"].endswith(" UTC")
    # what publishing writes is not code: a bench's saved result leaves the next one clean
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "codec.json").write_text("{}")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "benchmarks.md").write_text("# old")
    git("add", ".")
    git("commit", "-q", "-m", "two")
    (tmp_path / "bench" / "results" / "codec.json").write_text('{"figures": {}}')
    (tmp_path / "docs" / "benchmarks.md").write_text("# new")
    assert provenance(tmp_path)["dirty"] is False
    (tmp_path / "f.txt").write_text("b")
    assert provenance(tmp_path)["dirty"] is True


def test_run_records_the_command_sizes_date_commit_and_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.publish as publish

    monkeypatch.setitem(publish.BENCHES, "ledger",
                        publish.Bench(["--sizes", "3000", "--reps", "1"], ["--quick", "--sizes", "3000",
                                                                           "--reps", "1"], "ledger"))
    result = publish.run_bench("ledger", quick=True)
    assert result["command"] == "python -m bench.ledger --quick --sizes 3000 --reps 1 --json"
    assert result["quick"] is True
    assert set(result["measured"]) >= {"date", "commit", "dirty"}
    assert result["machine"]["cores"] >= 1
    assert result["figures"]["bytes_per_unit_3k"] > 0


def test_a_named_run_of_another_bench_runs_that_module_and_is_published_under_its_own_name(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``convergence_mnist`` is ``bench.convergence`` with mnist5000 named: run as that module with
    its arguments, saved and shown as its own entry, the gaps issue 14 asks for in its rows."""
    import subprocess

    import bench.publish as publish

    ran: list[list[str]] = []

    def fake_run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout='{"gap_mnist_30": 0.25}\n', stderr="")

    monkeypatch.setattr(publish, "run_child", fake_run)
    monkeypatch.setattr(publish, "provenance", lambda: {"date": "d", "commit": None, "dirty": None})
    result = publish.run_bench("convergence_mnist", quick=False)
    assert ran[-1][1:] == ["-m", "bench.convergence", "--workloads", "mnist5000", "--real-only", "--json"]
    assert result["command"] == "python -m bench.convergence --workloads mnist5000 --real-only --json"
    _save(tmp_path, "convergence_mnist", result)
    page = render(*load_results(tmp_path, root=tmp_path))
    assert "| `convergence_mnist` | `gap_mnist_30` | 0.25 |" in page
    assert "## `bench.convergence` (`convergence_mnist`)" in page


def test_an_unbounded_figure_shows_its_reason_alone(tmp_path: Path) -> None:
    _save(tmp_path, "convergence", {"command": "c", "figures": {
        "sim_vs_real_error": None, "reasons": {"sim_vs_real_error": "unbounded: in 1 seed(s) only one"}}})
    page = render(*load_results(tmp_path, root=tmp_path))
    assert "| `convergence` | `sim_vs_real_error` | unbounded: in 1 seed(s) only one |" in page


def _convergence(directory: Path, figures: dict[str, Any]) -> None:
    _save(directory, "convergence", {"command": "python -m bench.convergence --json", "figures": figures})


def test_a_figure_with_a_missed_seed_shows_n_of_m_and_an_unbounded_side_never_a_clean_range(
        tmp_path: Path) -> None:
    from vcasync.costing.spread import spread

    missed = spread([0.89, 0.91, 0.91, None, 0.88], miss="low")
    full = spread([0.53, 0.75, 0.75, 0.69, 0.53], miss="low")
    _convergence(tmp_path, {"saving_sim_64": missed.mean, "saving_sim_64_ci_low": None,
                            "saving_real": full.mean, "saving_real_ci_low": full.ci_low,
                            "spread": {"saving_sim_64": missed.as_dict(), "saving_real": full.as_dict()}})
    page = render(*load_results(tmp_path, root=tmp_path))
    row = next(line for line in page.splitlines() if line.startswith("| `convergence` | `saving_sim_64`"))
    assert "4 of 5 seeds reached" in row
    assert "95 % interval unbounded .. " in row
    assert "mean of the reached seeds 0.8975" in row
    assert "0.88-0.91" not in row                       # the reached values' range, as if none missed
    assert "median" not in row                          # a mean, said to be one
    full_row = next(line for line in page.splitlines() if line.startswith("| `convergence` | `saving_real`"))
    assert full_row == (f"| `convergence` | `saving_real` | mean 0.65 (95 % interval {full.ci_low:.4g} .. "
                        f"{full.ci_high:.4g}; 5 of 5 seeds reached) |")


def test_a_gap_says_seeds_measured_and_a_crashed_seed_is_not_called_a_miss(tmp_path: Path) -> None:
    """A gap exists for every seed that ran: "5 of 5 seeds reached" stood beside two missed loss
    targets on the tinylm row."""
    from vcasync.costing.spread import spread

    full = spread([0.01, 0.02, 0.03, 0.01, 0.02], miss="high", counted="measured")
    crashed = spread([0.5, 0.4, None], miss="high", counted="measured")
    _convergence(tmp_path, {"lm_loss_gap_30": full.mean, "gap_mnist_30": crashed.mean,
                            "spread": {"lm_loss_gap_30": full.as_dict(), "gap_mnist_30": crashed.as_dict()}})
    page = render(*load_results(tmp_path, root=tmp_path))
    lm = next(line for line in page.splitlines() if line.startswith("| `convergence` | `lm_loss_gap_30`"))
    assert "5 of 5 seeds measured)" in lm
    assert "reached" not in lm
    g = next(line for line in page.splitlines() if line.startswith("| `convergence` | `gap_mnist_30` "))
    assert "mean of the measured seeds 0.45" in g
    assert "2 of 3 seeds measured: a seed without a value leaves the interval unbounded above" in g
    assert "missed" not in g


def test_a_nan_figure_is_shown_as_not_a_number_with_its_reason(tmp_path: Path) -> None:
    (tmp_path / "convergence.json").write_text(
        '{"command": "c", "figures": {"saving_real": NaN, "sim_vs_real_error": NaN, '
        '"reasons": {"saving_real": "every seed crashed"}}}')
    page = render(*load_results(tmp_path, root=tmp_path))
    assert "| `convergence` | `saving_real` | not a number: every seed crashed |" in page
    assert ("| `convergence` | `sim_vs_real_error` | not a number (the bench saved NaN and gave no "
            "reason) |") in page
    assert "nan" not in page.replace("not a number", "")


def test_a_missing_results_directory_is_refused_and_the_page_left_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "page.md"
    page.write_text("before")
    assert main(["--results", str(tmp_path / "result"), "--page", str(page)]) == 2
    assert str(tmp_path / "result") in capsys.readouterr().err
    assert page.read_text() == "before"


@pytest.mark.parametrize(("text", "problem"), [
    ("", "not valid JSON"), ('{"command": "x", "figu', "not valid JSON"),
    ('{"command": "x", "figures": [1, 2]}', '"figures" must be an object'),
    ('{"command": "x"}', "got missing"), ("[1]", "a JSON object was expected")])
def test_a_malformed_results_file_is_named_with_its_problem_and_the_page_left_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, problem: str) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "merge.json").write_text(text)
    page = tmp_path / "page.md"
    page.write_text("before")
    assert main(["--results", str(results), "--page", str(page)]) == 2
    err = capsys.readouterr().err
    assert str(results / "merge.json") in err
    assert problem in err
    assert page.read_text() == "before"


def test_only_and_quick_without_run_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--only", "codec"], ["--quick"]):
        with pytest.raises(SystemExit) as exc:
            main(args)
        assert exc.value.code == 2
        assert "is for --run" in capsys.readouterr().err


def test_an_empty_only_with_run_is_refused_not_read_as_every_bench(
        capsys: pytest.CaptureFixture[str]) -> None:
    # found by QA: `--run --only ''` (an unset variable in a script) ran every bench, hours of them,
    # and re-saved every result, where `--only ,` was refused as naming none
    from bench.publish import parse

    for only in ("", ",", " "):
        with pytest.raises(SystemExit) as exc:
            parse(["--run", "--only", only])   # the parser alone: nothing is run either way
        assert exc.value.code == 2
        assert "--only" in capsys.readouterr().err


def test_a_page_that_cannot_be_written_is_refused_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # found by a review: `--page missing/dir/benchmarks.md` rendered the page and then ended in a
    # FileNotFoundError traceback; with --run, after every bench had run (hours) and saved its result
    from bench.publish import parse

    for argv, said in ((["--page", str(tmp_path / "missing" / "benchmarks.md")], "does not exist"),
                       (["--run", "--only", "codec", "--page", str(tmp_path / "missing" / "b.md")],
                        "after every bench has run"),
                       (["--page", str(tmp_path)], "is a directory")):
        with pytest.raises(SystemExit) as exc:
            parse(argv)                  # the parser alone: nothing is run, nothing written
        assert exc.value.code == 2
        assert said in capsys.readouterr().err
    assert sorted(tmp_path.iterdir()) == []
    # --check writes nothing, so a page that does not exist yet is only stale
    assert parse(["--check", "--page", str(tmp_path / "missing" / "benchmarks.md")]).check


def test_a_bench_named_twice_in_only_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # found by a review: `--run --only e2e,e2e` ran bench.e2e twice, the second result replacing
    # the first
    from bench.publish import parse

    with pytest.raises(SystemExit) as exc:
        parse(["--run", "--only", "e2e,codec,e2e"])
    assert exc.value.code == 2
    assert "--only: 'e2e' given twice" in capsys.readouterr().err


def test_check_says_whether_the_page_is_stale_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results"
    _save(results, "merge", {"command": "python -m bench.merge --json", "figures": {"vcasgd_vs_floor": 1.1}})
    page = tmp_path / "page.md"
    page.write_text("stale\n")
    assert main(["--results", str(results), "--page", str(page), "--check"]) == 1
    out = capsys.readouterr().out
    assert "differs" in out
    assert "-stale" in out
    assert page.read_text() == "stale\n"
    assert main(["--results", str(results), "--page", str(page)]) == 0
    assert main(["--results", str(results), "--page", str(page), "--check"]) == 0


def test_the_tox_bench_env_runs_every_published_bench_at_its_quick_sizes() -> None:
    """ledger, modelsize, gap_sweep and load were published on the page but never run by ``tox -e
    bench``; each line is parsed by its bench's own parser (never run here)."""
    import configparser
    import importlib

    ini = configparser.ConfigParser()
    ini.read(PAGE.parents[1] / "tox.ini")
    lines = [line.split() for line in ini["testenv:bench"]["commands"].splitlines() if line.strip()]
    run = [(words[2], words[3:]) for words in lines if words[:2] == ["python", "-m"]]
    # an entry that is a named run of another bench's (convergence_mnist) is run as that bench with
    # its own arguments
    missing = [name for name, spec in BENCHES.items()
               if (spec.module and (spec.module_of(name), spec.quick) not in run)
               or spec.module_of(name) not in {module for module, _ in run}]
    assert not missing, f"not run by tox -e bench at their quick arguments: {missing}"
    for module, args in run:
        assert "--quick" in args, f"tox -e bench runs {module} at its default sizes"
        importlib.import_module(module).parse(args)


def test_a_count_summed_over_repetitions_shows_each_repetitions(tmp_path: Path) -> None:
    figures = {"p99_ms_10k_conn": 6.8, "p99_ms_10k_conn_spread": [6.1, 6.8, 9.0],
               "failed_10k": 3, "failed_10k_per_rep": [0, 3, 0]}
    _save(tmp_path, "scale", {"command": "python -m bench.scale --json", "seconds": 1.0, "figures": figures})
    page = render(*load_results(tmp_path, root=tmp_path))
    assert "| `scale` | `p99_ms_10k_conn` | median 6.8 (min-max 6.1-9 over repetitions) |" in page
    assert "| `scale` | `failed_10k` | total 3 over 3 repetitions (each: 0, 3, 0) |" in page


def test_a_spread_with_an_unbounded_end_and_a_figure_with_its_own_centre_are_said_so(tmp_path: Path) -> None:
    """A failed repetition or a missed seed is saved as null in a spread: it is shown as unbounded
    (the spread was shown as raw JSON, and the headline lost it); a bench may say what a figure is
    beside its spread (``centres``)."""
    _save(tmp_path, "modelsize", {"command": "python -m bench.modelsize --json", "figures": {
        "ingest_linearity": 0.81, "ingest_linearity_spread": [0.78, 0.8, None],
        "rss_multiple_max": 6.4, "rss_multiple_max_spread": [6.1, 6.2, 6.3],
        "centres": {"rss_multiple_max": "the run's peak"}}})
    page = render(*load_results(tmp_path, root=tmp_path))
    assert ("| `modelsize` | `ingest_linearity` | 0.81 (per repetition: min 0.78, median 0.8, "
            "max unbounded) |") in page
    assert ("| `modelsize` | `rss_multiple_max` | the run's peak 6.4 (per repetition: min 6.1, "
            "median 6.2, max 6.3) |") in page
    assert "| `ingest_linearity_spread` | min 0.78, median 0.8, max unbounded |" in page


def test_a_peak_that_came_out_near_its_spreads_median_is_still_called_a_peak(tmp_path: Path) -> None:
    """bench.modelsize's rss_multiple_max is the run's peak; each upload's own peak came out within
    0.2 % of it (6.447 against 6.437), and the page called the peak a median."""
    _save(tmp_path, "modelsize", {"command": "python -m bench.modelsize --json", "figures": {
        "rss_multiple_max": 6.4468, "rss_multiple_max_spread": [6.437, 6.437, 6.437],
        "centres": {"rss_multiple_max": "the run's peak"}}})
    page = render(*load_results(tmp_path, root=tmp_path))
    assert ("| `modelsize` | `rss_multiple_max` | the run's peak 6.447 (per repetition: min 6.437, "
            "median 6.437, max 6.437) |") in page


def test_a_null_in_a_benchs_own_table_says_why_never_null(tmp_path: Path) -> None:
    # The convergence table showed `null` for every figure its default run leaves to another run
    # (gap_mnist_30, lm_loss_gap_30, ...) and for an interval a missed seed left open, with the
    # reasons as "(dict of 6: in the saved JSON)".
    _convergence(tmp_path, {
        "saving_sim_64": 0.79, "saving_sim_64_ci_low": None, "gap_mnist_30": None,
        "gap_mnist_30_ci_high": None, "sim_vs_real_error": None, "other": None,
        "reasons": {"saving_sim_64": "seed(s) [4]: no target",
                    "gap_mnist_30": "not measured in this run (add --workloads mnist5000)",
                    "sim_vs_real_error": "unbounded: in 1 seed(s) only one"}})
    page = render(*load_results(tmp_path, root=tmp_path))
    table = page[page.index("\n| figure | value |"):]
    assert "null" not in table
    assert "`reasons`" not in table
    assert "| `saving_sim_64` | 0.79: seed(s) [4]: no target |" in table
    assert "| `saving_sim_64_ci_low` | unbounded: seed(s) [4]: no target |" in table
    assert "| `gap_mnist_30` | not measured in this run (add --workloads mnist5000) |" in table
    assert "| `gap_mnist_30_ci_high` | not measured (as `gap_mnist_30`) |" in table
    assert "| `sim_vs_real_error` | unbounded: in 1 seed(s) only one |" in table
    assert "| `other` | not measured |" in table


def test_the_reliability_page_is_what_its_saved_figures_render_to() -> None:
    """docs/RELIABILITY.md says "Do not edit by hand: re-run it", but a hand edit (the base_unavailable
    limit) had drifted from bench/_reliability.py, so the next --write-docs would have dropped it."""
    from bench._reliability import render as render_reliability

    root = Path(__file__).resolve().parents[2]
    saved = json.loads((root / "docs" / "reliability.json").read_text())
    assert (root / "docs" / "RELIABILITY.md").read_text() == render_reliability(
        saved, Path("docs/reliability.json")), "run: python -m bench.chaos --only none --write-docs"


def test_the_reliability_page_counts_every_sigterm() -> None:
    from bench._reliability import render as render_reliability

    root = Path(__file__).resolve().parents[2]
    saved = json.loads((root / "docs" / "reliability.json").read_text())
    saved.update(worker_sigterm=10, sigterm_clean_exits=7, sigterm_escalated=1)
    assert "**2** exited within it with a status other than 0" in render_reliability(saved, "x.json")
    saved.update(sigterm_clean_exits=9)
    assert "status other than 0" not in render_reliability(saved, "x.json")
