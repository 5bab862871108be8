"""bench.convergence's figures come out even when its ``--plot`` cannot be drawn at the end: the
plot was drawn before the table and the JSON were printed, so a failure there lost a ~13-minute
run's figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.convergence as convergence


def test_a_plot_that_fails_at_the_end_leaves_the_table_and_json_printed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(convergence, "_print_table", lambda f: print("TABLE"))
    a = convergence.parse(["--json", "--plot", str(tmp_path / "saving.png")])

    def broken() -> None:
        raise OSError(28, "No space left on device")

    assert convergence.finish({"saving_real": 0.65}, a, broken) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == "TABLE"
    assert json.loads(out.splitlines()[-1]) == {"saving_real": 0.65}
    assert f"--plot {tmp_path / 'saving.png'} not written" in err
    assert "No space left" in err


def test_a_plot_that_draws_exits_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(convergence, "_print_table", lambda f: None)
    drawn: list[bool] = []
    a = convergence.parse(["--plot", str(tmp_path / "saving.svg")])
    assert convergence.finish({}, a, lambda: drawn.append(True)) == 0
    assert drawn == [True]
    assert convergence.finish({}, convergence.parse([]), lambda: drawn.append(False)) == 0
    assert drawn == [True]


def test_a_real_run_that_crashes_is_counted_in_failed_not_in_targets_missed_and_the_bench_goes_on(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from vcasync.errors import RunIncompleteError

    calls: list[int] = []

    def crash(workload: str, seed: int, *args: object, **kw: object) -> dict[str, object]:
        calls.append(seed)
        raise RunIncompleteError(f"the fleet did not finish (seed {seed})")

    monkeypatch.setattr(convergence, "real_run", crash)
    monkeypatch.setattr(convergence.torch, "set_num_threads", lambda n: None)
    assert convergence.main(["--quick", "--real-only", "--seeds", "0", "1", "--json"]) == 0
    assert calls == [0, 1]                                  # the first crash did not end the bench
    figures = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert figures["failed"] == 2
    assert [(f["workload"], f["seed"]) for f in figures["failed_runs"]] == [("digits", 0), ("digits", 1)]
    assert "RunIncompleteError" in figures["failed_runs"][0]["error"]
    assert figures["targets_missed"] == 0                   # a crash is not a missed target
    assert figures["spread"]["saving_real"]["reached"] == "0 of 2 seeds reached"   # nor dropped
