"""The Ray tests keep out of the user's Ray: their own HOME (where Ray keeps its auth token) and
RAY_TMPDIR (its sessions, and the cluster ``--address auto`` finds), and scenarios whose ``ray stop``
sees their own processes only. Found by a review: a token one test left in the real ~/.ray made a
later run of another fail (InvalidAuthToken), and ``ray stop --force`` in a scenario killed every
Ray process on the machine."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

_REAL_HOME = Path(pwd.getpwuid(os.getuid()).pw_dir)


def test_a_ray_test_runs_with_a_home_and_ray_temp_dir_of_its_own(tmp_path: Path) -> None:
    assert Path.home() == tmp_path / "home" != _REAL_HOME
    ray_tmp = Path(os.environ["RAY_TMPDIR"])
    assert ray_tmp.is_dir()
    assert ray_tmp.parent == Path(tempfile.gettempdir())
    assert "RAY_ADDRESS" not in os.environ


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a loopback-only network namespace needs root and unshare (CI has both)")
def test_a_scenarios_ray_writes_in_its_own_home_and_its_ray_stop_sees_only_its_processes(
        tmp_path: Path, run_scenario: Callable[[str, Path], dict[str, Any]]) -> None:
    # a process outside the scenario that `ray stop` would kill if it saw it (it matches 'log_monitor.py')
    outside = tmp_path / "log_monitor.py"
    outside.write_text("import time\ntime.sleep(600)\n")
    sentinel = subprocess.Popen([sys.executable, str(outside)])
    try:
        r = run_scenario("sandbox_scenario.py", tmp_path / "work")
    finally:
        sentinel.kill()
        sentinel.wait()
    assert r["home"] == str(tmp_path / "work" / "home")
    assert ".ray/auth_token" in r["home_files"]            # Ray's token went to the scenario's home
    assert not r["session_dir"].startswith("/tmp/ray/")
    assert not [args for args in r["ray_stop_would_kill"] if str(outside) in args], r["ray_stop_would_kill"]
