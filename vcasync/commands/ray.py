"""``vcasync ray``: run, watch, resize and stop a fleet of workers as Ray actors (``vcasync[ray]``).

::

    vcasync ray --address auto up --workers 16 --coordinator http://HEAD:8470 \\
        --trainer mypkg.train:train --state-root s3://bucket/run1/workers
    vcasync ray status            # each worker: node, restarted?, state, last log line
    vcasync ray scale 8           # while the run goes
    vcasync ray down

``--address`` and ``--namespace`` come before the action. The join secret comes from ``up
--join-secret-file`` or ``VCASYNC_JOIN_SECRET`` (or ``VCASYNC_JOIN_TOKEN``) on the driver, never a
flag's value, read and checked as ``vcasync worker`` reads it (:func:`vcasync.cli.read_join_credential`:
the file first) before ``up`` connects; the actors get what was read. ``up`` refuses a
spec that differs from the fleet already running in the namespace (``down`` first to replace it;
``scale`` keeps the running spec), and warns when no node could take a worker (a resource or label no
alive node has). ``up`` waits (up to a minute) until its actors are constructed: one that died
doing it (a trainer that does not import on the nodes) is printed and the exit status is ERROR.
``status`` still shows such a dead worker (``dead``, ``error``: what its constructor raised) and
``down`` removes it. ``up --wait`` stays until every worker is done, printing status changes; the exit
status is OK when the run finished, ERROR when a worker failed or its actor died, INCOMPLETE when
``--wait-timeout`` passed first. No Ray cluster at ``--address`` is a configuration error.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path
from typing import Any

from .._owner_lease import MAX_TTL_S, MIN_TTL_S
from ..cli import Command, ExitCode, join_credential_env, read_join_credential
from ..coerce import argument_number
from ..errors import ConfigError, RunIncompleteError

#: How long the driver waits for a Ray cluster's address to answer before it calls it absent.
CONNECT_TIMEOUT_S = 10.0
#: How long ``up`` (without ``--wait``) waits for its new actors to be constructed, so that one
#: whose trainer does not import is reported (exit status ERROR) instead of a silent exit 0.
STARTUP_WAIT_S = 60.0


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default="auto", help="Ray cluster address (default: auto)")
    p.add_argument("--namespace", default="vcasync", help="Ray namespace of the fleet's named actors")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = sub.add_parser("up", help="start N worker actors on spot nodes")
    # Every value is checked while parsing, before Ray is imported or connected to: without a
    # cluster, `--workers 0` and `--gpus inf` were reported as "no Ray cluster to connect to", and
    # with one, `up --workers 0` exited 0 having started nothing.
    up.add_argument("--workers", type=argument_number(int, 1), required=True, metavar="N",
                    help="worker actors to run (at least 1; 'scale 0' or 'down' stops them)")
    up.add_argument("--coordinator", required=True, help="the coordinator's URL, reachable from every node")
    up.add_argument("--trainer", required=True, help="trainer 'pkg.mod:fn', importable on every node")
    up.add_argument("--state-root", required=True,
                    help="storage URL; worker i keeps its state at STATE_ROOT/worker-i")
    up.add_argument("--app-dir", help="directory on every node to put on sys.path for the trainer")
    up.add_argument("--grace-period", default=20.0, metavar="SECONDS",
                    type=argument_number(float, 0, strict=True, high=MAX_TTL_S,
                                         what="a finite number of seconds"),
                    help="how long a stopped worker has to store its checkpoint (default 20, at "
                         f"most {MAX_TTL_S:g})")
    up.add_argument("--join-secret-file", type=Path,
                    help="file whose first line is the join secret the workers join with (read as "
                         "vcasync worker reads it; instead of VCASYNC_JOIN_SECRET)")
    # refused while parsing, before Ray is imported or an actor started (each actor's worker
    # refused it only once it ran, and the fleet died actor by actor)
    up.add_argument("--state-lease", default=30.0, metavar="SECONDS",
                    type=argument_number(float, MIN_TTL_S, high=MAX_TTL_S,
                                         what="a finite number of seconds"),
                    help="how long a silent worker keeps its state from a replacement (default 30, "
                         f"at least {MIN_TTL_S:g}, at most {MAX_TTL_S:g}; renewed every third of it)")
    up.add_argument("--spot-resource", default="spot",
                    help="Ray resource that spot nodes carry ('' places workers anywhere)")
    up.add_argument("--spot-label", action="append", default=[], metavar="KEY=VALUE",
                    help="node label a worker's node must carry, e.g. ray.io/market-type=spot (repeatable)")
    up.add_argument("--cpus", type=argument_number(float, 0), default=1.0, help="CPUs per worker actor")
    up.add_argument("--gpus", type=argument_number(float, 0), default=0.0, help="GPUs per worker actor")
    up.add_argument("--wait", action="store_true", help="stay until every worker is done")
    up.add_argument("--wait-timeout", type=float, default=None, metavar="SECONDS",
                    help="with --wait: give up after this long (exit status 5); default: no limit")
    scale = sub.add_parser("scale", help="change the number of workers while the run goes")
    scale.add_argument("count", type=argument_number(int, 0), metavar="COUNT",
                       help="workers to run: more start, the highest beyond it stop (0: every one)")
    sub.add_parser("status", help="print each worker's status as JSON lines")
    sub.add_parser("down", help="stop every worker gracefully and remove the actors (pending ones too)")


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


def _ray_target(address: str) -> str | None:
    """The ``host:port`` the driver will connect to for ``address`` (``auto`` looked up the way Ray
    does it), or None where Ray starts a local instance itself."""
    if address.startswith("ray://"):
        return address.removeprefix("ray://").partition("/")[0]
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:  # a Ray without this helper: let ray.init find it
        return None
    try:
        target = canonicalize_bootstrap_address(address)
    except ConnectionError as exc:
        raise ConfigError(f"no Ray cluster to connect to (--address {address}): {exc}".rstrip(".")
                          + "; start one with 'ray start --head', or pass its address") from None
    except ValueError as exc:
        raise ConfigError(f"--address {address!r} is not a Ray address (HOST:PORT, auto or ray://HOST:PORT):"
                          f" {exc}") from None
    return str(target) if target else None


def _connect(ray: Any, address: str, namespace: str, log_to_driver: bool) -> None:
    """``ray.init``, after checking within :data:`CONNECT_TIMEOUT_S` that something answers at the
    cluster's address (Ray itself retries an absent address for minutes)."""
    target = _ray_target(address)
    if target is not None:
        host, _, port = target.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
                pass
        except (OSError, ValueError) as exc:
            raise ConfigError(f"no Ray cluster answers at {target} (--address {address}) within "
                              f"{CONNECT_TIMEOUT_S:g}s: {exc}") from None
    try:
        ray.init(address=address, namespace=namespace, log_to_driver=log_to_driver)
    except ConnectionError as exc:
        raise ConfigError(f"cannot connect to the Ray cluster at {address}: {exc}") from None


def _run(a: argparse.Namespace) -> int:
    from ..launch.ray import FAILED, RayFleet, RayWorkerSpec, _ray, shutdown_fleet

    ray = _ray()
    spec = None
    credentials: dict[str, str] = {}
    if a.action == "up":
        from ..worker._client import check_coordinator_url

        check_coordinator_url(a.coordinator)     # the flag named, before the spec's own check
        # read and checked as `vcasync worker` reads it; the actors get what was read
        credentials = join_credential_env(*read_join_credential(a.join_secret_file))
        if a.wait_timeout is not None and not a.wait_timeout > 0:
            raise ConfigError(f"--wait-timeout must be > 0 seconds, got {a.wait_timeout!r}")
        # Checked before connecting: a bad spec is refused without touching the cluster.
        spec = RayWorkerSpec(coordinator=a.coordinator, trainer=a.trainer, state_root=a.state_root,
                             app_dir=a.app_dir, grace_period_s=a.grace_period,
                             state_lease_s=a.state_lease, spot_resource=a.spot_resource or None,
                             spot_labels=_labels(a.spot_label), num_cpus=a.cpus, num_gpus=a.gpus,
                             namespace=a.namespace)
    _connect(ray, a.address, a.namespace, log_to_driver=a.action == "up")
    try:
        if spec is not None:
            fleet = RayFleet(spec, credentials=credentials)
            print(json.dumps({"running": fleet.scale(a.workers)}), flush=True)
            problem = fleet.placement_problem()
            if problem:
                print(f"vcasync ray up: warning: Ray cannot place the workers: {problem}; they stay "
                      "pending until such a node joins ('vcasync ray down' removes them)",
                      file=sys.stderr, flush=True)
            if not a.wait:
                # A trainer that does not import on the nodes kills each actor in its constructor:
                # said here, not left to a 'status' run later.
                started = fleet.wait_started(timeout_s=STARTUP_WAIT_S)
                dead = {i: s for i, s in started.items() if s.get("state") == "dead"}
                silent = sorted(i for i, s in started.items() if s.get("state") == "unavailable")
                if silent:
                    print(f"vcasync ray up: warning: worker(s) {silent} did not answer within "
                          f"{STARTUP_WAIT_S:g}s of their start; 'vcasync ray status' shows them",
                          file=sys.stderr, flush=True)
                if not dead:
                    return ExitCode.OK
                for st in dead.values():
                    print(json.dumps(_summary(st)), flush=True)
                print(f"vcasync ray up: error: worker(s) {sorted(dead)} died as they started: "
                      f"{next(iter(dead.values())).get('error')}; 'vcasync ray status' shows them, "
                      "'vcasync ray down' removes them", file=sys.stderr, flush=True)
                return ExitCode.ERROR
            try:
                final = fleet.wait(timeout_s=a.wait_timeout, on_change=lambda _i, st: print(
                    json.dumps(_summary(st)), flush=True))
            except TimeoutError as exc:
                raise RunIncompleteError(f"{exc}; the workers keep running ('vcasync ray status')") from None
            for st in final.values():
                print(json.dumps(_summary(st)), flush=True)
            return ExitCode.ERROR if any(s["state"] in FAILED for s in final.values()) else ExitCode.OK
        if a.action == "down":
            stopped = shutdown_fleet(a.namespace)
            if not stopped:
                raise ConfigError(f"no vcasync workers in the Ray namespace {a.namespace!r}")
            print(json.dumps({"stopped": stopped}), flush=True)
            return ExitCode.OK
        fleet = RayFleet.attach(a.namespace)
        if a.action == "scale":
            print(json.dumps({"running": fleet.scale(a.count)}), flush=True)
        else:
            for st in fleet.status().values():
                print(json.dumps(_summary(st)), flush=True)
        return ExitCode.OK
    finally:
        if ray.is_initialized():
            ray.shutdown()
        sys.stdout.flush()


COMMAND = Command(name="ray", help="run workers as Ray actors on spot nodes (needs vcasync[ray])",
                  configure=_configure, run=_run)
