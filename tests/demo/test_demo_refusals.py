"""``vcasync demo`` refuses what it cannot run before anything starts: exit 2, the problem named,
no process started (``Proc.start`` fails the test here), the run directory left as it was.
"""

from __future__ import annotations

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
