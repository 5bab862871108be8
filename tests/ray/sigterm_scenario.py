"""A SIGTERM to a worker actor's process mid-unit (a drain, ``ray stop``, a ``kill``); run by
test_ray_fleet.py inside a network namespace that has only loopback and a PID namespace of its own
(conftest.scenario).

A one-node Ray (``ray.init``) with a ``spot`` resource, a coordinator process, one worker actor. Once the
worker holds a checkpoint of its lease its process gets SIGTERM; Ray restarts the actor, and the run goes
on to its end. Prints one JSON object of what happened: the lease cut short, the restarted worker's log,
the coordinator's log, the final states and version, what the actors left in their $TMPDIR.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import ray
from cluster_scenario import APP_DIR, SECRET, checkpoint_of, free_port, version, wait_until

from vcasync.launch.ray import RayFleet, RayWorkerSpec

UNITS, STEPS = 2, 80


def main(work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    env = {**os.environ, "VCASYNC_JOIN_SECRET": SECRET, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    coord_log = work / "coord.log"
    with coord_log.open("ab") as logf:
        coord = subprocess.Popen(
            [sys.executable, "-m", "vcasync", "coordinator", "--model", "vcasync.examples.digits:model",
             "--units", str(UNITS), "--steps", str(STEPS), "--unit-param", "checkpoint_every=5",
             "--storage", (work / "run").as_uri(), "--durability", "journal", "--lease-timeout", "120",
             "--host", "127.0.0.1", "--port", str(port), "--linger", "600"],
            stdout=logf, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until("the coordinator", lambda: version(url) is not None)
        os.environ["VCASYNC_JOIN_SECRET"] = SECRET
        ray.init(address="local", num_cpus=2, resources={"spot": 1}, namespace="vcasync-term",
                 include_dashboard=False, log_to_driver=False)
        state, tmp = work / "state", work / "tmp"      # tmp: the actors' $TMPDIR
        state.mkdir()
        tmp.mkdir()
        spec = RayWorkerSpec(coordinator=url, trainer="resume_probe:train", state_root=state.as_uri(),
                             app_dir=str(APP_DIR), grace_period_s=10, state_lease_s=3,
                             namespace="vcasync-term",
                             env={"SLOW_DIGITS_DELAY_S": "0.1", "OMP_NUM_THREADS": "1",
                                  "TMPDIR": str(tmp)})
        fleet = RayFleet(spec)
        fleet.scale(1)
        first = wait_until("a running worker", lambda: (s := fleet.status()[0])["state"] == "running" and s)
        lease = wait_until("the worker mid-unit with a checkpoint",
                           lambda: checkpoint_of(state / "worker-0"), timeout=180)
        os.kill(first["pid"], signal.SIGTERM)
        out["terminated_lease"] = lease
        wait_until("the actor restarted", lambda: fleet.status(timeout_s=5)[0].get("restarted"), timeout=180)
        final = fleet.wait(timeout_s=300, poll_s=1)
        out["final"] = {i: {k: s.get(k) for k in ("state", "restarted", "error")} for i, s in final.items()}
        out["log"] = final[0].get("log", [])
        out["version"] = version(url)
        fleet.shutdown()
        out["left_in_tmp"] = sorted(p.name for p in tmp.glob("vcasync-*"))   # torch keeps its own
    finally:
        ray.shutdown()
        coord.send_signal(signal.SIGTERM)
        out["coordinator_exit"] = coord.wait(60)
        out["coordinator_log"] = coord_log.read_text(errors="replace").splitlines()
    return out


if __name__ == "__main__":
    Path(sys.argv[2]).write_text(json.dumps(main(Path(sys.argv[1]))))
