"""A home and a Ray temp dir of their own for every Ray test, and the runner of the scenario scripts.

Ray keeps an auth token in ``~/.ray/auth_token`` (``ray.init`` and ``ray start`` write one when there is
none) and its sessions in ``$RAY_TMPDIR/ray`` (``/tmp/ray``), where ``--address auto`` finds a running
cluster: with the user's real HOME and /tmp, a token one test left made another's clients fail
(InvalidAuthToken), and a test could find and drive someone else's cluster. ``ray stop --force``
kills every Ray-looking process it can see: a scenario runs in PID and network namespaces of its own
(``unshare --net --pid --fork --mount-proc``), where it sees its own processes only, and all of them
end with it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# What a test sets, and what could point Ray elsewhere, to go: ray_sandbox sets or drops each.
_RAY_VARS = ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE")


@contextmanager
def ray_sandbox(work: Path) -> Iterator[dict[str, str]]:
    """The environment for Ray under ``work``: HOME ``work/home`` and a fresh RAY_TMPDIR, removed after.

    RAY_TMPDIR is a short path under the system's temp dir, not under ``work``: Ray's unix sockets
    live in it, and a socket path may not pass 107 bytes."""
    home = work / "home"
    home.mkdir(parents=True, exist_ok=True)
    ray_tmp = tempfile.mkdtemp(prefix="vcasync-ray-")
    env = {k: v for k, v in os.environ.items() if k not in _RAY_VARS}
    env.update(HOME=str(home), RAY_TMPDIR=ray_tmp)
    try:
        yield env
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(autouse=True)
def _ray_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each test here runs with its own HOME and RAY_TMPDIR (for Ray in this process)."""
    with ray_sandbox(tmp_path) as env:
        for var in _RAY_VARS:
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("HOME", env["HOME"])
        monkeypatch.setenv("RAY_TMPDIR", env["RAY_TMPDIR"])
        yield Path(env["HOME"])


def scenario(name: str, work: Path) -> dict[str, Any]:
    """Run ``name`` (a script beside this file) in a loopback-only network namespace and a PID
    namespace of its own, with :func:`ray_sandbox`'s environment; its account of what happened,
    which it writes as JSON."""
    result_file = work / "result.json"
    # bash stays PID 1 (no exec): it reaps the processes Ray orphans, which a Python PID 1 would not
    script = f"ip link set lo up && {sys.executable} {HERE / name} {work} {result_file}"
    with ray_sandbox(work) as env:
        proc = subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount-proc", "--",
                               "bash", "-c", script], cwd=ROOT, env=env, capture_output=True, timeout=540)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    result: dict[str, Any] = json.loads(result_file.read_text())
    return result


@pytest.fixture(scope="session")
def run_scenario() -> Callable[[str, Path], dict[str, Any]]:
    """:func:`scenario`, for the tests (and module-scoped fixtures) that run one."""
    return scenario
