"""``vcasync ray`` against a Ray head that cannot run the workers it is given; run by test_ray_fleet.py
inside a network namespace that has only loopback and a PID namespace of its own (conftest.scenario).

A head with 2 CPUs and no ``spot`` resource. A fleet whose trainer does not import (its actor dies in
its constructor) must end ``up --wait`` with ERROR, not hang, and ``up`` without ``--wait`` too, once
the actor died (not exit 0); ``status`` then shows it dead and ``down`` removes it; a fleet asking
for ``spot`` stays pending, which ``up`` warns of and ``status`` reports within its bound; a second
``up`` with another spec is refused; ``down`` removes the pending actor at once. Prints one JSON
object of what happened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RAY = str(Path(sys.executable).with_name("ray"))


def cli(*args: str) -> dict[str, Any]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "vcasync", "ray", "--address", "127.0.0.1:6379", *args],
                          capture_output=True, timeout=240, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out = proc.stdout.decode(errors="replace")
    return {"rc": proc.returncode, "s": round(time.monotonic() - t0, 1),
            "lines": [json.loads(line) for line in out.splitlines() if line.startswith("{")],
            "err": proc.stderr.decode(errors="replace")}


def main(work: Path) -> dict[str, Any]:
    os.environ["VCASYNC_JOIN_SECRET"] = "abcdefghijklmnopqrstuvwxyz0123456789"
    up = ["up", "--workers", "1", "--coordinator", "http://127.0.0.1:9", "--state-root",
          (work / "state").as_uri()]
    subprocess.run([RAY, "start", "--head", "--num-cpus", "2", "--node-ip-address", "127.0.0.1",
                    "--port", "6379", "--disable-usage-stats"], check=True, capture_output=True, timeout=180)
    try:
        return {
            "bad": cli("--namespace", "bad", *up, "--trainer", "nonexistent.mod:train", "--spot-resource", "",
                       "--wait", "--wait-timeout", "150"),
            # found by a probe: `up` without --wait exited 0 with this fleet, then `status` and `down`
            # said "no vcasync workers" once Ray dropped the dead actor's name
            "dead_up": cli("--namespace", "dead", *up, "--trainer", "nonexistent.mod:train",
                           "--spot-resource", ""),
            "dead_status": cli("--namespace", "dead", "status"),
            "dead_down": cli("--namespace", "dead", "down"),
            "dead_after_down": cli("--namespace", "dead", "status"),
            "pending_up": cli("--namespace", "pend", *up, "--trainer", "vcasync.examples.digits:train"),
            "pending_status": cli("--namespace", "pend", "status"),
            "other_spec": cli("--namespace", "pend", "up", "--workers", "2", "--coordinator",
                              "http://127.0.0.1:9999", "--trainer", "vcasync.examples.digits:train",
                              "--state-root", (work / "other").as_uri()),
            "down": cli("--namespace", "pend", "down"),
            "after_down": cli("--namespace", "pend", "status"),
        }
    finally:
        # stops every Ray process it sees: in the scenario's own PID namespace (conftest.scenario), this
        # head's only; HOME and RAY_TMPDIR are the scenario's own too (its auth token, its session)
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)


if __name__ == "__main__":
    Path(sys.argv[2]).write_text(json.dumps(main(Path(sys.argv[1]))))
