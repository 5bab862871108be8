"""``vcasync ray``: run, watch, resize and stop a fleet of workers as Ray actors (``vcasync[ray]``).

::

    vcasync ray up --address auto --workers 16 --coordinator http://HEAD:8470 \\
        --trainer mypkg.train:train --state-root s3://bucket/run1/workers
    vcasync ray status            # each worker: node, restarted?, state, last log line
    vcasync ray scale 8           # while the run goes
    vcasync ray down

The join secret comes from ``VCASYNC_JOIN_SECRET`` (or ``VCASYNC_JOIN_TOKEN``) on the driver, never a
flag. ``up --wait`` stays until every worker is done, printing status changes; the exit status is
OK when the run finished, ERROR when a worker failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..cli import Command, ExitCode
from ..errors import ConfigError


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default="auto", help="Ray cluster address (default: auto)")
    p.add_argument("--namespace", default="vcasync", help="Ray namespace of the fleet's named actors")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = sub.add_parser("up", help="start N worker actors on spot nodes")
    up.add_argument("--workers", type=int, required=True)
    up.add_argument("--coordinator", required=True, help="the coordinator's URL, reachable from every node")
    up.add_argument("--trainer", required=True, help="trainer 'pkg.mod:fn', importable on every node")
    up.add_argument("--state-root", required=True,
                    help="storage URL; worker i keeps its state at STATE_ROOT/worker-i")
    up.add_argument("--app-dir", help="directory on every node to put on sys.path for the trainer")
    up.add_argument("--grace-period", type=float, default=20.0)
    up.add_argument("--state-lease", type=float, default=30.0)
    up.add_argument("--spot-resource", default="spot",
                    help="Ray resource that spot nodes carry ('' places workers anywhere)")
    up.add_argument("--spot-label", action="append", default=[], metavar="KEY=VALUE",
                    help="node label a worker's node must carry, e.g. ray.io/market-type=spot (repeatable)")
    up.add_argument("--cpus", type=float, default=1.0, help="CPUs per worker actor")
    up.add_argument("--gpus", type=float, default=0.0, help="GPUs per worker actor")
    up.add_argument("--wait", action="store_true", help="stay until every worker is done")
    scale = sub.add_parser("scale", help="change the number of workers while the run goes")
    scale.add_argument("count", type=int)
    sub.add_parser("status", help="print each worker's status as JSON lines")
    sub.add_parser("down", help="stop every worker gracefully and remove the actors")


def _labels(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--spot-label must look like KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def _summary(st: dict[str, object]) -> dict[str, object]:
    lines = st.get("log") or []
    return {k: st.get(k) for k in ("index", "state", "node_id", "restarted", "error")} | {
        "last_log": lines[-1] if isinstance(lines, list) and lines else None}


def _run(a: argparse.Namespace) -> int:
    from ..launch.ray import RayFleet, RayWorkerSpec, _ray

    ray = _ray()
    credential = os.environ.get("VCASYNC_JOIN_SECRET") or os.environ.get("VCASYNC_JOIN_TOKEN")
    if a.action == "up" and not credential:
        raise ConfigError("no join credential: set VCASYNC_JOIN_SECRET or VCASYNC_JOIN_TOKEN")
    ray.init(address=a.address, namespace=a.namespace, log_to_driver=a.action == "up")
    try:
        if a.action == "up":
            spec = RayWorkerSpec(coordinator=a.coordinator, trainer=a.trainer, state_root=a.state_root,
                                 app_dir=a.app_dir, grace_period_s=a.grace_period,
                                 state_lease_s=a.state_lease, spot_resource=a.spot_resource or None,
                                 spot_labels=_labels(a.spot_label), num_cpus=a.cpus, num_gpus=a.gpus,
                                 namespace=a.namespace)
            fleet = RayFleet(spec)
            print(json.dumps({"running": fleet.scale(a.workers)}), flush=True)
            if not a.wait:
                return ExitCode.OK
            final = fleet.wait()
            for st in final.values():
                print(json.dumps(_summary(st)), flush=True)
            return ExitCode.ERROR if any(s["state"] == "failed" for s in final.values()) else ExitCode.OK
        fleet = RayFleet.attach(a.namespace)
        if a.action == "scale":
            print(json.dumps({"running": fleet.scale(a.count)}), flush=True)
        elif a.action == "status":
            for st in fleet.status().values():
                print(json.dumps(_summary(st)), flush=True)
        else:
            fleet.shutdown()
        return ExitCode.OK
    finally:
        ray.shutdown()
        sys.stdout.flush()


COMMAND = Command(name="ray", help="run workers as Ray actors on spot nodes (needs vcasync[ray])",
                  configure=_configure, run=_run)
