"""The production ``vcasync coordinator`` carries no test switches: with every chaos variable set
(a pause at the start-up snapshot, every storage write failing) and the repository's ``harness`` on
its ``PYTHONPATH``, it starts and serves as if they were not there. Only the test-only
``python -m harness.chaos_coordinator`` honours them (tests/core/test_testkit.py checks that the
installed package never imports the harness at all). And what it says at start-up when its storage
would not outlive it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from harness import CHAOS_COORDINATOR, harness_env
from harness.fleet import free_port, toml_text
from vcasync._spawn import module_command

SECRET = "switches-join-secret-0123456789abcdef"


def _table(store: str) -> dict[str, object]:
    return {"model": {"factory": "vcasync.examples.digits:model"},
            "units": {"shards": 2, "epochs": 1, "steps": 5},
            "storage": {"url": store},
            "coordinator": {"durability": "journal"}}


@contextlib.contextmanager
def _coordinator(module: str, run_dir: Path, env: dict[str, str],
                 storage: str | None = None) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.toml").write_text(toml_text(_table(storage or f"file://{run_dir / 'store'}")))
    port = free_port()
    with (run_dir / "coordinator.log").open("wb") as log:
        proc = subprocess.Popen(
            module_command(module, "coordinator", "--config", str(run_dir / "run.toml"), "--port", str(port)),
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=run_dir,
            env=harness_env({**os.environ, "OMP_NUM_THREADS": "1", "VCASYNC_JOIN_SECRET": SECRET, **env}))
    try:
        yield proc, port
    finally:
        proc.kill()
        proc.wait()


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _until(check: object, proc: subprocess.Popen[bytes], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and proc.poll() is None:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def _switches(markers: Path) -> dict[str, str]:
    return {"VCASYNC_PAUSE_AT": "snapshot@1", "VCASYNC_PAUSE_DIR": str(markers), "VCASYNC_PAUSE_S": "60",
            "VCASYNC_STORAGE_FAULTS": "fail=1.0,ops=put+put_stream"}


def test_the_production_command_ignores_the_chaos_variables(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    with _coordinator("vcasync", tmp_path / "prod", _switches(markers)) as (proc, port):
        assert _until(lambda: _healthy(port), proc, 90), (tmp_path / "prod" / "coordinator.log").read_text()
    # No pause at the start-up snapshot, and that snapshot really reached the disk.
    assert list(markers.iterdir()) == []
    assert any((tmp_path / "prod" / "store").rglob("*snapshots*"))


def test_the_chaos_entry_point_honours_them(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {k: v for k, v in _switches(markers).items() if k != "VCASYNC_STORAGE_FAULTS"}
    with _coordinator(CHAOS_COORDINATOR, tmp_path / "chaos", env) as (proc, _port):
        # It pauses inside its first snapshot write, and says so with a marker file.
        assert _until(lambda: (markers / f"snapshot.{proc.pid}").exists(), proc, 90), \
            (tmp_path / "chaos" / "coordinator.log").read_text()


def test_a_coordinator_on_storage_inside_its_process_warns_that_a_restart_starts_over(tmp_path: Path) -> None:
    # memory:// is gone with the process: under a supervisor that restarts it (Kubernetes, systemd)
    # the run would start over silently
    run_dir = tmp_path / "mem"
    with _coordinator("vcasync", run_dir, {}, storage="memory://trial") as (proc, port):
        assert _until(lambda: _healthy(port), proc, 90), (run_dir / "coordinator.log").read_text()
    log = (run_dir / "coordinator.log").read_text()
    assert "storage memory://trial lives in this process" in log, log
    assert "starts the run over" in log
    with _coordinator("vcasync", tmp_path / "disk", {}) as (proc, port):
        assert _until(lambda: _healthy(port), proc, 90)
    assert "lives in this process" not in (tmp_path / "disk" / "coordinator.log").read_text()
