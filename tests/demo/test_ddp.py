"""The DDP baseline on two real processes (gloo over 127.0.0.1) for a few steps.

It must be what a user would run instead of vcasync: the ranks end with the same weights (the
gradients really were all-reduced), and the result equals single-process SGD on the combined batch.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from pathlib import Path

import pytest

pytest.importorskip("sklearn", reason="the demo needs scikit-learn (vcasync[demo])")

from tests._procs import live_processes, wait_until
from vcasync.demo.baseline import sync_sgd
from vcasync.demo.ddp import DdpConfig, run_ddp
from vcasync.errors import ConfigError, RunIncompleteError
from vcasync.examples.workloads import get_workload


def test_two_ranks_train_in_lockstep_like_one_big_batch(tmp_path: Path) -> None:
    cfg = DdpConfig(workers=2, workload="digits", batch_size=16, samples=2 * 16 * 6, lr=0.1, seed=4,
                    eval_points=3, timeout_s=180)
    res = run_ddp(cfg, tmp_path)
    assert len(res.digests) == 2
    assert res.digests[0] == res.digests[1]
    assert res.points[0][1] == 0
    assert res.points[-1][1] == 6 * 32
    times = [p[0] for p in res.points]
    assert times == sorted(times)
    # the clock starts before the processes: start-up is paid, and is part of the curve
    assert 0 < res.first_step_s <= times[0] <= res.wall_s
    ref = sync_sgd(get_workload("digits"), workers=2, batch_size=16, samples=cfg.samples, lr=0.1,
                   momentum=0.9, seed=4, eval_points=3)
    assert res.final_loss == pytest.approx(ref.points[-1][3], rel=1e-4)
    assert res.final_accuracy == pytest.approx(ref.final_accuracy, abs=0.003)
    assert (tmp_path / "ddp-rank1.log").exists()


def test_paced_steps_take_their_time_and_change_no_arithmetic(tmp_path: Path) -> None:
    """``min_step_s`` stands for a costlier model on both sides of the comparison: every step lasts
    at least that long (the demo's workers are paced the same way), and the weights are those of
    the unpaced run."""
    cfg = DdpConfig(workers=2, workload="digits", batch_size=16, samples=2 * 16 * 6, lr=0.1, seed=4,
                    eval_points=6, timeout_s=180, min_step_s=0.3)
    res = run_ddp(cfg, tmp_path)
    assert res.digests[0] == res.digests[1]
    assert res.points[-1][0] - res.points[0][0] >= 6 * 0.3 - 0.05  # evaluation is off the clock
    ref = sync_sgd(get_workload("digits"), workers=2, batch_size=16, samples=cfg.samples, lr=0.1,
                   momentum=0.9, seed=4, eval_points=3)
    assert res.final_loss == pytest.approx(ref.points[-1][3], rel=1e-4)


def test_the_demo_compares_with_a_baseline_on_the_same_footing() -> None:
    from vcasync.demo.run import DemoConfig

    cfg = DemoConfig(workers=3, batch_size=16, momentum=0.8, seed=7, min_step_s=0.2, sync_lr=0.3,
                     progress=False)
    ddp = cfg.ddp_config(960)
    assert (ddp.workers, ddp.workload, ddp.batch_size, ddp.samples) == (3, "digits", 16, 960)
    assert (ddp.lr, ddp.momentum, ddp.seed, ddp.min_step_s) == (0.3, 0.8, 7, 0.2)


def test_a_failing_rank_is_a_clear_error(tmp_path: Path) -> None:
    # the ranks ran and failed: the run is incomplete, not its configuration wrong (exit 2 said
    # "nothing changed" after a whole fleet had run)
    cfg = DdpConfig(workers=2, workload="no-such-data", batch_size=8, samples=32, lr=0.1, timeout_s=60)
    with pytest.raises(RunIncompleteError, match=r"DDP rank failed \(rank \d exited with status 1"):
        run_ddp(cfg, tmp_path)


def test_a_rank_killed_from_outside_ends_the_baseline_and_stops_the_others(tmp_path: Path) -> None:
    # Found by hand: a rank SIGKILLed (the OOM killer) in the rendezvous left rank 0 waiting there,
    # and run_ddp waited for rank 0 until the gloo timeout (--max-wall, 15 minutes in the demo),
    # then said only that the baseline "did not finish"; killed later, it was "configuration error".
    cfg = DdpConfig(workers=2, workload="digits", batch_size=16, samples=2 * 16 * 2000, lr=0.1,
                    eval_points=3, timeout_s=120)
    out = tmp_path / "ddp"
    caught: list[BaseException] = []

    def run() -> None:
        try:
            run_ddp(cfg, out)
        except BaseException as exc:    # handed to the test's thread
            caught.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        def rank1() -> list[int]:
            return [pid for pid, cmd in live_processes(str(out)).items() if "--rank 1 " in cmd]

        wait_until("DDP rank 1", rank1, 120)
        os.kill(rank1()[0], signal.SIGKILL)
    finally:
        thread.join()
    assert len(caught) == 1, caught
    assert isinstance(caught[0], RunIncompleteError), repr(caught[0])
    assert "DDP rank failed (rank 1 killed by SIGKILL)" in str(caught[0])
    assert "the other ranks were stopped" in str(caught[0])
    assert not live_processes(str(out))


def test_bad_config_is_refused() -> None:
    with pytest.raises(ConfigError):
        DdpConfig(workers=0, workload="digits", batch_size=8, samples=32, lr=0.1)
    with pytest.raises(ConfigError):
        DdpConfig(workers=2, workload="digits", batch_size=8, samples=32, lr=0.0)
    with pytest.raises(ConfigError, match="min_step_s"):
        DdpConfig(workers=2, workload="digits", batch_size=8, samples=32, lr=0.1, min_step_s=-1.0)


def test_a_coordinator_kill_on_storage_that_dies_with_it_is_refused(tmp_path: Path) -> None:
    # memory:// lives in the coordinator's process: killed and restarted on it, the run started
    # over from a fresh model and ended at chance accuracy while the report said "all recovered"
    from vcasync.demo.run import DemoConfig

    with pytest.raises(ConfigError, match="outlives the coordinator process; memory://x"):
        DemoConfig(kill_coordinator=True, storage="memory://x")
    DemoConfig(kill_coordinator=False, storage="memory://x")           # no restart: fine
    DemoConfig(kill_coordinator=True, storage=str(tmp_path / "state"))  # on disk: fine
    DemoConfig(kill_coordinator=True, storage=(tmp_path / "s").as_uri())


def test_a_run_dir_that_holds_an_earlier_run_is_refused_before_anything_starts(tmp_path: Path) -> None:
    # Found by running the demo twice with one --run-dir: the coordinator found the earlier run
    # finished and exited, and the demo said only "the coordinator exited at start"
    from vcasync.demo.run import DemoConfig, run_demo

    (tmp_path / "state").mkdir()
    (tmp_path / "report.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"is not empty \(it holds an earlier demo run\)"):
        asyncio.run(run_demo(DemoConfig(run_dir=tmp_path, progress=False)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "state"]   # nothing added
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        asyncio.run(run_demo(DemoConfig(run_dir=tmp_path / "file", progress=False)))


def test_a_storage_that_holds_an_earlier_run_is_refused_before_anything_starts(tmp_path: Path) -> None:
    # the coordinator resumed what it found there: an earlier finished run ended it at once
    from vcasync.demo.run import DemoConfig, run_demo

    store = tmp_path / "store"
    (store / "vcasync").mkdir(parents=True)
    (store / "vcasync" / "run.json").write_text("{}")
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"--storage .* is not empty \(it holds 'vcasync/run.json'"):
        asyncio.run(run_demo(DemoConfig(run_dir=run_dir, storage=store.as_uri(), progress=False)))
    assert not run_dir.exists()                      # refused before anything was made


def test_a_negative_seed_and_a_count_beside_a_rate_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # Found by hand: --seed -1 started the whole fleet, then failed as "a DDP rank failed";
    # --preemptions 2 beside --preempt-per-min 1 was ignored without a word.
    from vcasync.cli import main
    from vcasync.demo.run import DemoConfig

    with pytest.raises(ConfigError, match=r"seed \(--seed\) must be in \[0, 2\*\*32\)"):
        DemoConfig(seed=-1)
    assert main(["demo", "--preemptions", "2", "--preempt-per-min", "1"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["demo", "--seed", "-1"]) == 2
    assert "seed (--seed) must be" in capsys.readouterr().err
