"""A spot preemption on a multi-node Ray cluster, end to end; run by test_ray_fleet.py inside a network
namespace that has only loopback, so nothing here can reach any other address, and a PID namespace of
its own (conftest.scenario).

A coordinator process; a Ray cluster of a head (no spot resource) and three worker nodes (``spot``),
each a separate raylet, with a ``spot`` resource and a spot label; three worker actors asking for both
(one per spot node). Mid-unit, worker 0's node is removed
without notice and a new spot node added; worker 2 is scaled away mid-run and back. Prints one JSON
object with what happened; the test asserts on it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import ray
from ray.cluster_utils import Cluster

from vcasync.launch.ray import RayFleet, RayWorkerSpec

UNITS, STEPS = 6, 60
SECRET = "ray-fleet-join-secret-5b7e9d21"
SPOT_LABELS = {"ray.io/market-type": "spot"}   # as KubeRay and the autoscaler label spot nodes
APP_DIR = Path(__file__).resolve().parents[1] / "integration"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(what: str, predicate: Any, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.2)
    raise TimeoutError(what)


def version(url: str) -> int | None:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2) as r:
            return int(json.loads(r.read())["version"])
    except OSError:
        return None


def checkpoint_of(state: Path) -> str | None:
    """The lease worker ``state`` is on, once it holds a checkpoint of it (a kill now is mid-unit)."""
    try:
        lease = json.loads((state / "lease.json").read_text())["lease_id"]
    except (OSError, ValueError, KeyError):
        return None
    return lease if list((state / "checkpoints" / lease).glob("*.pt")) else None


def cli(address: str, *args: str) -> Any:
    """``vcasync ray ARGS`` in a process of its own; its JSON lines (one value when only one)."""
    proc = subprocess.run([sys.executable, "-m", "vcasync", "ray", "--address", address,
                           "--namespace", "vcasync-test", *args], capture_output=True, timeout=180)
    if proc.returncode != 0:
        raise RuntimeError(f"vcasync ray {args} exited {proc.returncode}: {proc.stderr[-3000:]!r}")
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines() if line.startswith("{")]
    return lines[0]["running"] if args[0] == "scale" else lines


def main(work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    env = {**os.environ, "VCASYNC_JOIN_SECRET": SECRET, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (work / "coord.log").open("ab") as logf:
        coord = subprocess.Popen(
            [sys.executable, "-m", "vcasync", "coordinator", "--model", "vcasync.examples.digits:model",
             "--shards", str(UNITS), "--epochs", "1", "--steps", str(STEPS),
             "--unit-param", "checkpoint_every=5", "--storage", (work / "run").as_uri(),
             "--durability", "journal", "--lease-timeout", "120", "--host", "127.0.0.1",
             "--port", str(port), "--linger", "600"], stdout=logf, stderr=subprocess.STDOUT, env=env)
    cluster = None
    try:
        wait_until("the coordinator", lambda: version(url) is not None)
        t0 = time.monotonic()
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        spot = [cluster.add_node(num_cpus=1, resources={"spot": 1}, labels=SPOT_LABELS) for _ in range(3)]
        os.environ["VCASYNC_JOIN_SECRET"] = SECRET
        ray.init(address=cluster.address, namespace="vcasync-test", log_to_driver=False)
        cluster.wait_for_nodes()
        out["cluster_up_s"] = round(time.monotonic() - t0, 1)
        out["node_addresses"] = sorted({n["NodeManagerAddress"] for n in ray.nodes()})

        (work / "bucket" / "workers").mkdir(parents=True)
        state_root = (work / "bucket" / "workers").as_uri()
        spec = RayWorkerSpec(coordinator=url, trainer="resume_probe:train", state_root=state_root,
                             app_dir=str(APP_DIR), grace_period_s=10, state_lease_s=3,
                             namespace="vcasync-test", spot_labels=SPOT_LABELS,
                             env={"SLOW_DIGITS_DELAY_S": "0.05", "OMP_NUM_THREADS": "1"})
        fleet = RayFleet(spec)
        out["scaled_up"] = fleet.scale(3)
        first = wait_until("three running workers", lambda: (st := fleet.status()) and all(
            s["state"] == "running" for s in st.values()) and st)
        out["spot_nodes"] = sorted(n.node_id for n in spot)
        out["first_nodes"] = {i: s["node_id"] for i, s in first.items()}

        # Preemption without notice: worker 0's node vanishes mid-unit; capacity comes back.
        workers = work / "bucket" / "workers"
        lease = wait_until("worker 0 mid-unit with a checkpoint", lambda: checkpoint_of(workers / "worker-0"))
        victim = next(n for n in spot if n.node_id == first[0]["node_id"])
        cluster.remove_node(victim, allow_graceful=False)
        t1 = time.monotonic()
        new_node = cluster.add_node(num_cpus=1, resources={"spot": 1}, labels=SPOT_LABELS)
        out["killed_lease"], out["new_node"] = lease, new_node.node_id
        back = wait_until("worker 0 running again", lambda: (s := fleet.status(timeout_s=5)[0])
                          and s["state"] not in ("unavailable", "starting") and s, timeout=180)
        out["restart_s"] = round(time.monotonic() - t1, 1)
        out["restarted_node"], out["restarted"] = back["node_id"], back["restarted"]

        # Scale down while the run goes (worker 2 checkpoints and keeps its lease in storage), then up,
        # and look at the fleet: with the `vcasync ray` command, from drivers of their own.
        out["scaled_down"] = cli(cluster.address, "scale", "2")
        out["scaled_up_again"] = cli(cluster.address, "scale", "3")
        out["cli_status"] = cli(cluster.address, "status")

        final = fleet.wait(timeout_s=300, poll_s=1)
        out["final"] = {i: {k: s.get(k) for k in ("state", "node_id", "restarted", "report", "error")}
                        for i, s in final.items()}
        out["logs"] = {i: s.get("log", []) for i, s in final.items()}
        out["version"] = version(url)
        fleet.shutdown()
        out["after_down"] = sorted(fleet.status())
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        coord.send_signal(signal.SIGTERM)
        out["coordinator_exit"] = coord.wait(60)
    return out


if __name__ == "__main__":
    result = main(Path(sys.argv[1]))
    Path(sys.argv[2]).write_text(json.dumps(result))
