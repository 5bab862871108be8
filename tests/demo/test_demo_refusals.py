"""``vcasync demo`` refuses what it cannot run before anything starts: exit 2, the problem named,
no process started (``Proc.start`` fails the test here), the run directory left as it was.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("sklearn", reason="the demo needs scikit-learn (vcasync[demo])")

from vcasync.cli import main
from vcasync.demo.procs import Proc
from vcasync.exit_codes import ExitCode


@pytest.fixture(autouse=True)
def _nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    async def start(self: Proc) -> None:
        raise AssertionError(f"{self.name} was started")

    monkeypatch.setattr(Proc, "start", start)


def _demo(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["demo", "--quick", "--no-progress", *args])
    return code, capsys.readouterr().err


def test_a_run_dir_below_a_file_is_refused_by_name(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file.json").write_text("{}")
    bad = tmp_path / "file.json" / "sub"
    code, err = _demo(capsys, "--run-dir", str(bad))         # was a NotADirectoryError traceback
    assert code == ExitCode.CONFIG, err
    assert f"--run-dir {bad} cannot be made: {tmp_path / 'file.json'} is a file, not a directory" in err


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_a_run_dir_the_system_will_not_make_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _demo(capsys, "--run-dir", "/proc/nope")     # was a FileNotFoundError traceback
    assert code == ExitCode.CONFIG, err
    assert "--run-dir /proc/nope cannot be made" in err
    assert not Path("/proc/nope").exists()


@pytest.mark.parametrize(("args", "said"), [
    (["--policy", "nosuch"], "no merge policy named 'nosuch'; available: "),
    (["--policy-param", "alpha=abc"], "parameter 'alpha' of policy 'vcasgd' must be float, got 'abc'"),
    (["--policy-param", "alpha=0.1.2"], "--policy-param alpha: '0.1.2' is not a valid value"),
    (["--policy-param", "beta=1"], "unknown parameter(s) for policy 'vcasgd': beta"),
    (["--policy-param", "alpha=5"], "alpha must be in [0, 1), got 5"),
    # a new-user probe: 'nan' said "must be float, got 'nan'"
    (["--policy-param", "alpha=nan"], "--policy-param alpha must be a finite number, got 'nan'"),
    (["--policy-param", "alpha=-Infinity"], "--policy-param alpha must be a finite number, got '-Infinity'"),
])
def test_a_policy_the_coordinator_would_refuse_is_named_and_the_run_dir_left_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str) -> None:
    # it was "the coordinator exited at start; see .../logs/coordinator.log", with the run dir
    # filled, so a re-run with the same --run-dir was refused as not empty
    run_dir = tmp_path / "run"
    code, err = _demo(capsys, "--run-dir", str(run_dir), *args)
    assert code == ExitCode.CONFIG, err
    assert said in err
    assert "exited at start" not in err
    assert not run_dir.exists()
    run_dir.mkdir()                      # an empty directory given: still empty after the refusal
    code, err = _demo(capsys, "--run-dir", str(run_dir), *args)
    assert code == ExitCode.CONFIG, err
    assert not any(run_dir.iterdir())


@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "+inf", "-Infinity", "Infinity"])
def test_simulate_and_demo_policy_params_say_a_non_finite_number_must_be_finite(raw: str) -> None:
    from vcasync.errors import ConfigError
    from vcasync.sim.cli import parse_params
    said = rf"^--policy-param alpha must be a finite number, got '{re.escape(raw)}'$"
    with pytest.raises(ConfigError, match=said):
        parse_params([f"alpha={raw}"])
    assert parse_params(["alpha=0.5", "staleness=polynomial", "name=info"]) == {
        "alpha": 0.5, "staleness": "polynomial", "name": "info"}


@pytest.mark.parametrize(("args", "said"), [
    # a new-user probe: the refusal named the config field (max_wall_s) the user never typed
    (["--max-wall", "-1"], "max_wall_s (--max-wall) must be a finite number of seconds > 0"),
    (["--grace", "-1"], "grace_s (--grace) must be a finite number of seconds > 0"),
    (["--kill-fraction", "2"], "kill_fraction (--kill-fraction) must be in [0, 1], got 2.0"),
    (["--workers", "0"], "workers (--workers) must be 1 to 64"),
    (["--restart-delay", "3", "1"], "restart delay (--restart-delay) must be finite seconds"),
    (["--kill-coordinator", "--durability", "none"], "kill_coordinator (--kill-coordinator) needs durable"),
])
def test_a_setting_out_of_range_is_refused_by_the_flag_the_user_typed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str) -> None:
    code, err = _demo(capsys, "--run-dir", str(tmp_path / "run"), *args)
    assert code == ExitCode.CONFIG, err
    assert said in err
    assert not (tmp_path / "run").exists()
