"""A real run's record, saved and replayed without a new real run (``--save-records``,
``--replay-records``), and the two measurements the replay now takes from it: what a noticed worker
does until it exits, and when the run's monitor scored the fleet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.convergence as convergence
from bench._exit_cpu import exit_cpu
from bench._real_records import FORMAT, load_record, save_record
from vcasync.errors import ConfigError
from vcasync.sim.fleet import Outage


def _real() -> dict[str, object]:
    measured = {"outages": {0: [Outage(9.8, 12.9, 1.6)], 2: [Outage(11.5, 14.7, 0.0)]},
                "first_worker_s": 1.5, "scored_s": [2.0, 5.1, 8.3, 11.4],
                "exits": [{"pid": 7, "signal_s": 8.2, "exit_s": 1.6, "cpu_s": 0.6, "share": 0.375}],
                "sample_cost_s": float("nan")}
    return {"report": {"metric": "accuracy", "time_to_target_s": 20.5}, "measured": measured}


def test_a_record_reads_back_as_it_was_measured(tmp_path: Path) -> None:
    path = tmp_path / "digits-seed3.json"
    save_record(path, workload="digits", seed=3, workers=4, cores=2.0, real=_real())
    rec = load_record(path)
    assert (rec["workload"], rec["seed"], rec["workers"], rec["cores"]) == ("digits", 3, 4, 2.0)
    m = rec["real"]["measured"]
    assert m["outages"] == {0: [Outage(9.8, 12.9, 1.6)], 2: [Outage(11.5, 14.7, 0.0)]}
    assert m["scored_s"] == [2.0, 5.1, 8.3, 11.4]
    assert m["sample_cost_s"] is None          # NaN has no JSON: written as null
    assert rec["real"]["report"]["time_to_target_s"] == 20.5


def test_a_file_that_is_not_a_record_is_refused_by_name(tmp_path: Path) -> None:
    bad = tmp_path / "convergence.json"
    bad.write_text(json.dumps({"saving_real": 0.7}))
    with pytest.raises(ConfigError, match=r"convergence\.json: not a real-run record"):
        load_record(bad)
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        load_record(tmp_path / "x.json")
    (tmp_path / "y.json").write_text(json.dumps({"format": FORMAT, "workload": "digits", "seed": 0,
                                                 "workers": 4, "report": {},
                                                 "measured": {"outages": {"0": [[1.0]]}}}))
    with pytest.raises(ConfigError, match="outages"):
        load_record(tmp_path / "y.json")
    with pytest.raises(ConfigError, match="cannot read"):
        load_record(tmp_path / "missing.json")


def test_replay_records_refuses_a_bad_file_before_any_replay(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x.json").write_text("[]")
    assert convergence.main(["--replay-records", str(tmp_path / "x.json")]) == 2
    assert "x.json: not a real-run record" in capsys.readouterr().err


def test_save_records_needs_a_directory_it_can_write(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        convergence.parse(["--save-records", str(tmp_path / "absent")])
    assert convergence.parse(["--save-records", str(tmp_path)]).save_records == tmp_path


def test_an_exit_is_the_cpu_from_the_signal_to_the_last_sample() -> None:
    t0 = 100.0
    # pid 7: SIGTERM at 5.0 s (run clock), exits at 6.6 s; sampled every 0.5 s
    samples = {7: [(t0 + 4.5, 3.0), (t0 + 5.0, 3.1), (t0 + 5.5, 3.4), (t0 + 6.0, 3.6), (t0 + 6.5, 3.7)],
               8: [(t0 + 1.0, 1.0)]}
    rows = exit_cpu([(7, 5.0, 6.6), (8, 5.0, 6.0), (9, 5.0, 6.0)], samples, t0)
    assert len(rows) == 1                       # pid 8 was not seen after its signal, 9 never
    assert rows[0]["exit_s"] == pytest.approx(1.6)
    assert rows[0]["cpu_s"] == pytest.approx(0.6)
    assert rows[0]["share"] == pytest.approx(0.375)


def test_the_replay_takes_the_exits_share_and_the_monitors_instants() -> None:
    m = _real()["measured"]
    assert isinstance(m, dict)
    assert convergence.exit_share(m) == pytest.approx(0.375)
    assert convergence.exit_share({"exits": []}) == 0.0        # no SIGTERM in the run: nothing
    assert convergence.exit_share({}) == 0.0                   # a record from before: nothing
    # the replay's clock starts at the first worker's start, 1.5 s into the run
    assert convergence.scoring_instants(m) == pytest.approx((0.5, 3.6, 6.8, 9.9))
    assert convergence.scoring_instants({"first_worker_s": 1.5}) == ()


def test_the_sampler_sees_a_real_child_burn_its_cpu() -> None:
    import subprocess
    import sys

    from bench._exit_cpu import ChildCpuSampler

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\ntime.sleep(0.2)"
    with ChildCpuSampler() as sampler:
        child = subprocess.Popen([sys.executable, "-c", burn])
        child.wait()
    seen = sampler.samples[child.pid]
    assert seen[-1][1] >= 0.3            # its CPU seconds, read from /proc while it ran
    assert [t for t, _ in seen] == sorted(t for t, _ in seen)
