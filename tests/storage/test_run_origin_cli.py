"""A seed sweep in one working directory, as the probe ran it (D2): ``vcasync coordinator`` with
``--seed`` 0 then 1 on the default storage (``./vcasync-run``). The second start used to resume the
first seed's run (a finished one: "already finished", exit 0, ``--output`` the first seed's weights);
the factory and the seed are now part of the run's identity, so another seed or another factory of
the same shapes is refused as not matching, while the same command, after a crash, still resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from vcasync._spawn import module_command
from vcasync.cli import ExitCode

SECRET = "origin-join-secret-0123456789"
MODEL = "vcasync.examples.digits:model"


class Coord:
    """One ``vcasync coordinator`` process in ``cwd`` (its storage the default ``./vcasync-run``)."""

    def __init__(self, cwd: Path, name: str, *args: str) -> None:
        self.port_file = cwd / f"{name}.url"
        self.log_path = cwd / f"{name}.log"
        env = {**os.environ, "VCASYNC_JOIN_SECRET": SECRET, "OMP_NUM_THREADS": "1"}
        cmd = module_command("vcasync", "coordinator", "--app-dir", str(cwd), "--units", "2",
                             "--steps", "2", "--linger", "0", "--port", "0", "--port-file",
                             str(self.port_file), *args)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def ready(self) -> None:
        deadline = time.monotonic() + 120
        while not self.port_file.exists():
            assert self.proc.poll() is None, self.log()[-3000:]
            assert time.monotonic() < deadline, self.log()[-3000:]
            time.sleep(0.05)

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()

    def stop(self, sig: int) -> int:
        self.proc.send_signal(sig)
        return self.wait()


@pytest.mark.slow
def test_a_seed_sweep_in_one_directory_is_refused_and_the_same_command_resumes(
        tmp_path: Path) -> None:
    (tmp_path / "twin.py").write_text(f"from {MODEL.partition(':')[0]} import model as _m\n\n\n"
                                      "def model():\n    return _m()\n")
    seed0 = ("--model", MODEL, "--seed", "0")
    first = Coord(tmp_path, "first", *seed0)
    first.ready()
    first.stop(signal.SIGKILL)                      # a crash: the supervisor runs the command again
    again = Coord(tmp_path, "again", *seed0)
    again.ready()
    assert again.stop(signal.SIGTERM) == 130
    assert "does not match" not in again.log()
    assert "took run" in again.log()                # resumed the crashed run, not a new one
    run = (tmp_path / "vcasync-run" / "vcasync" / "run").read_bytes()

    seed1 = Coord(tmp_path, "seed1", "--model", MODEL, "--seed", "1",
                  "--output", str(tmp_path / "final-seed1.pt"))
    twin = Coord(tmp_path, "twin", "--model", "twin:model", "--seed", "0")
    # refused within seconds (before: both resumed the run and served it)
    assert seed1.wait(60) == twin.wait(60) == ExitCode.CONFIG
    assert ("initial model: the run was started with seed=0, this start asks for seed=1"
            in seed1.log()), seed1.log()[-2000:]
    assert (f"initial model: the run was started with factory={MODEL!r}, this start asks for "
            "factory='twin:model'" in twin.log()), twin.log()[-2000:]
    for refused in (seed1, twin):
        assert "--new-run" in refused.log()
        assert "already finished" not in refused.log()
    assert not (tmp_path / "final-seed1.pt").exists()
    assert (tmp_path / "vcasync-run" / "vcasync" / "run").read_bytes() == run   # nothing changed

    fresh = Coord(tmp_path, "fresh", "--model", MODEL, "--seed", "1", "--new-run")
    fresh.ready()
    assert fresh.stop(signal.SIGTERM) == 130
    assert (tmp_path / "vcasync-run" / "vcasync" / "run").read_bytes() != run
