"""Where Ray writes, and what ``ray stop`` would kill, in a scenario's namespaces; run by
test_ray_sandbox.py as test_ray_fleet.py runs its scenarios (conftest.scenario).

Starts and stops a one-node Ray (``ray.init``), then prints one JSON object: the home Ray saw, the
files it left there, its session dir, and the command lines of every process ``ray stop`` would match
(it does not run ``ray stop``: run outside the namespaces, that would kill other people's clusters).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import ray
from ray.autoscaler._private.constants import RAY_PROCESSES


def ray_stop_would_kill() -> list[str]:
    """The command lines ``ray stop`` matches (its own rule: the name, or the whole command line)."""
    import psutil  # Ray's own copy, on the path once ray is imported (as `ray stop` uses it)

    found = []
    for proc in psutil.process_iter():
        try:
            name, args = proc.name(), subprocess.list2cmdline(proc.cmdline())
        except psutil.Error:
            continue
        if any(keyword in (name if by_name else args) for keyword, by_name in RAY_PROCESSES):
            found.append(args)
    return found


def main(work: Path) -> dict[str, Any]:
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        session_dir = ray._private.worker.global_worker.node.get_session_dir_path()
    finally:
        ray.shutdown()
    home = Path.home()
    return {"home": str(home), "session_dir": session_dir,
            "home_files": sorted(str(p.relative_to(home)) for p in home.rglob("*")),
            "ray_stop_would_kill": ray_stop_would_kill()}


if __name__ == "__main__":
    Path(sys.argv[2]).write_text(json.dumps(main(Path(sys.argv[1]))))
