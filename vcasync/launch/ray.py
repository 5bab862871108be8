"""vcasync workers as Ray actors: placed on spot nodes, restarted by Ray when a node is preempted.

::

    import ray
    from vcasync.launch.ray import RayFleet, RayWorkerSpec

    ray.init(address="auto")
    spec = RayWorkerSpec(coordinator="http://10.0.0.5:8470", trainer="mypkg.train:train",
                         state_root="s3://my-bucket/run1/workers")
    fleet = RayFleet(spec)
    fleet.scale(16)          # 16 actors, each on a node with the spot resource
    fleet.scale(8)           # fewer: the highest-numbered stop gracefully (SIGTERM semantics)
    print(fleet.status())    # per actor: node, restarts, worker state, its latest log lines
    fleet.wait()             # until every worker reports the run finished

Why this holds up under preemption: actor ``i`` keeps its worker state at ``{state_root}/worker-{i}``
(:mod:`vcasync.worker._remote_state`), not on its node. When a spot node vanishes without notice Ray
restarts the actor (``max_restarts=-1``) on another node that carries the spot resource; the new
incarnation opens the same state URL, waits out the dead one's owner record, and resumes its lease from
the last checkpoint. Actors are named (``vcasync-worker-<i>``) and detached in a Ray namespace, so a
later driver (``vcasync ray status``, ``vcasync ray scale``) finds the same fleet.

The join secret travels in the actors' ``runtime_env`` (from the driver's ``VCASYNC_JOIN_SECRET``,
or what ``vcasync ray up --join-secret-file`` read),
so it is visible to whoever can read the Ray cluster's job specs: the same people who can run code
on it. It is never logged.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import BackendUnavailableError, ConfigError, StorageError
from ._fleet_state import (
    FAILED,
    death_reason,
    fleet_done,
    placement_problem,
    run_until_settled,
    spec_differences,
)

__all__ = ["FAILED", "RayFleet", "RayWorkerSpec", "actor_options", "ray_available", "shutdown_fleet"]

log = logging.getLogger("vcasync.launch.ray")

ACTOR_PREFIX = "vcasync-worker-"
_LOG_LINES = 200


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("the Ray launcher needs Ray: pip install 'vcasync[ray]'") from exc
    return ray


def ray_available() -> bool:
    try:
        _ray()
    except ConfigError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class RayWorkerSpec:
    """What every worker actor of a fleet runs, and where it may run."""

    coordinator: str
    trainer: str
    #: Actor ``i`` keeps its state at ``{state_root}/worker-{i}``: a storage URL every node reaches
    #: (not a relative path, nor ``memory://``, which a restarted actor would find empty).
    state_root: str
    #: Directory put on ``sys.path`` to import the trainer (must exist on every node), or None.
    app_dir: str | None = None
    grace_period_s: float = 20.0
    state_lease_s: float = 30.0
    #: Ray custom resource that marks spot nodes; each actor asks for a sliver of it. None: anywhere.
    spot_resource: str | None = "spot"
    #: Node labels a worker's node must carry (Ray's ``label_selector``), e.g.
    #: ``{"ray.io/market-type": "spot"}`` as KubeRay and the autoscaler set them. Empty: no condition.
    spot_labels: Mapping[str, str] = field(default_factory=dict)
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    namespace: str = "vcasync"
    #: Extra environment for the actors (storage endpoints, thread counts); secrets belong in
    #: ``VCASYNC_JOIN_SECRET`` on the driver, which is passed on without being stored here.
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from .._imports import split_ref
        from ..worker._client import check_coordinator_url

        check_coordinator_url(self.coordinator, "coordinator")   # or every actor fails at its first call
        split_ref(self.trainer, what="trainer")                   # imported on the nodes, not here
        _check_state_root(self.state_root)
        _check_state_url(self.state_url(0))
        _check_state_outlives_actors(self.state_root)
        if not (self.grace_period_s > 0 and math.isfinite(self.grace_period_s)):  # NaN fails `<= 0` too
            raise ConfigError(f"grace_period_s must be a finite number > 0, got {self.grace_period_s!r}")
        if not all(n >= 0 and math.isfinite(n) for n in (self.num_cpus, self.num_gpus)):   # NaN, inf
            raise ConfigError(f"num_cpus and num_gpus must be >= 0 and finite, got {self.num_cpus!r} and "
                              f"{self.num_gpus!r}")

    def state_url(self, index: int) -> str:
        """``{state_root}/worker-{index}``, the URL's query (its storage options) kept at the end."""
        base, sep, query = _split_query(self.state_root)
        return f"{base}/worker-{index}{sep}{query}"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "env": dict(self.env), "spot_labels": dict(self.spot_labels)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RayWorkerSpec:
        return cls(**{k: v for k, v in raw.items() if k in {f.name for f in dataclasses.fields(cls)}})


def _split_query(url: str) -> tuple[str, str, str]:
    """``(base, "?", query)`` of a storage URL; a plain path has no query (a '?' there is a name)."""
    return url.partition("?") if "://" in url else (url, "", "")


def _check_state_root(root: str) -> None:
    if not isinstance(root, str) or not root:
        raise ConfigError(f"state_root must be a non-empty storage URL, got {root!r}")
    base, _, _ = _split_query(root)
    if "://" in root and "#" in root:
        raise ConfigError(f"state_root {root!r} must not have a '#fragment'")
    if base.endswith("/"):
        raise ConfigError(f"state_root {root!r} must not end with '/': each worker's state is "
                          "state_root + '/worker-<i>' (before the URL's query, if any)")
    parts = urlsplit(base) if "://" in base else None
    path = base if parts is None else parts.path if parts.scheme.lower() == "file" else "/"
    if not path.startswith("/"):
        raise ConfigError(f"state_root {root!r} is a relative path: every actor would resolve it in its "
                          "own working directory, on its own node, so a restarted worker would not find "
                          "its state; give an absolute path every node reaches (file:///shared/run1) or "
                          "an object store URL (s3://bucket/run1/workers)")


def _check_state_url(url: str) -> None:
    """Refuse what ``vcasync worker --state`` refuses (as it does: the same check), before any actor
    starts or the spec is stored in the cluster: an unknown option, a secret in the URL, a scheme
    without a backend. A backend whose package is missing here may be installed on the nodes: warned."""
    from ..storage import available_backends, url_scheme
    from ..worker._remote_state import check_state_url

    try:
        check_state_url(url)
    except BackendUnavailableError as exc:
        if url_scheme(url) not in available_backends():
            raise ConfigError(f"state_root: {exc}") from None
        log.warning("state_root not checked on this machine: %s", exc)
    except ConfigError as exc:
        raise ConfigError(f"state_root: {exc}") from None


def _check_state_outlives_actors(root: str) -> None:
    """Refuse a store whose objects live in the process that opens it (``memory://``): each actor
    would keep its state in its own memory, so the actor Ray restarts after a preemption would find
    none, join as a new worker and train the unit again from step 0 (the work of the dead one lost)."""
    from ..storage import outlives_process

    try:
        durable = outlives_process(root)
    except StorageError:   # a backend not installed here (already warned of): the nodes may have it
        return
    if not durable:
        raise ConfigError(f"state_root {root!r} lives in the memory of the process that opens it: each "
                          "actor would keep its state there, and one Ray restarts (its node preempted) "
                          "would find none, join as a new worker and train its unit again from step 0; "
                          "give storage every node reaches (s3://bucket/run1/workers, gs://..., or "
                          "file:///shared/run1 on a shared file system)")


class _Ring(logging.Handler):
    """The newest log lines of this process, for :meth:`RayFleet.status`."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: collections.deque[str] = collections.deque(maxlen=_LOG_LINES)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class WorkerActor:
    """One vcasync worker inside a Ray actor process: it starts training when constructed (Ray
    re-runs the constructor when it restarts the actor elsewhere), in a thread, so ``status`` and
    ``stop`` calls are answered meanwhile (the actor runs with ``max_concurrency=4``)."""

    def __init__(self, spec: dict[str, Any], index: int) -> None:
        from ..worker import Worker, WorkerConfig

        self.spec = RayWorkerSpec.from_dict(spec)
        self.index = index
        self.ring = _Ring()
        root = logging.getLogger()
        root.setLevel(logging.INFO)
        root.addHandler(self.ring)
        if not any(type(h) is logging.StreamHandler for h in root.handlers):
            stream = logging.StreamHandler()  # stderr: Ray streams it to the driver
            stream.setFormatter(self.ring.formatter)
            root.addHandler(stream)
        ray = _ray()
        ctx = ray.get_runtime_context()
        self.node_id = str(ctx.get_node_id())
        self.restarted = bool(ctx.was_current_actor_reconstructed)
        from .._imports import import_object

        trainer = import_object(self.spec.trainer, what="trainer",
                                app_dir=Path(self.spec.app_dir) if self.spec.app_dir else None)
        # A fresh local cache each incarnation: on a new node the disk is empty anyway. Kept across
        # the retries of this incarnation (what storage did not take yet stays there) and removed
        # once its worker is done for good (finished, failed, stopped), as `vcasync worker` removes
        # its temporary directory: it holds the worker's token. Until 2026-12-07 every incarnation
        # left one behind in $TMPDIR for as long as the node lived.
        self._cache = cache = tempfile.mkdtemp(prefix=f"vcasync-worker-{index}-")
        config = WorkerConfig(name=f"ray-{index}", grace_period_s=self.spec.grace_period_s,
                              state_lease_s=self.spec.state_lease_s)

        def new_worker() -> Worker:
            return Worker(self.spec.coordinator, trainer, state_dir=cache,
                          state=self.spec.state_url(index),
                          join_secret=os.environ.get("VCASYNC_JOIN_SECRET") or None,
                          join_token=os.environ.get("VCASYNC_JOIN_TOKEN") or None, config=config)

        self._new_worker = new_worker
        try:
            self.worker = new_worker()
        except BaseException:
            shutil.rmtree(cache, ignore_errors=True)
            raise
        self._stopping = threading.Event()
        self._swap = threading.Lock()      # stop() and a retry's new Worker, one at a time
        self.state = "starting"
        self.report: dict[str, Any] | None = None
        self.error: str | None = None
        log.info("worker %d on node %s (%s), state %s", index, self.node_id[:12],
                 "restarted" if self.restarted else "first start", self.spec.state_url(index))
        self.thread = threading.Thread(target=self._run, name=f"vcasync-worker-{index}", daemon=True)
        self.thread.start()
        self._stop_on_sigterm()

    def _stop_on_sigterm(self) -> None:
        """A SIGTERM to the actor's process (a drain, ``ray stop``, ``kill``) stops the worker as
        :meth:`stop` does (checkpoint stored, lease kept in its state) before Ray's own handler
        ends the process; Ray then restarts the actor, which resumes the lease. Until 2026-12-07 the
        process exited under the running worker: the trainer failed on the interpreter's shutdown
        ("cannot schedule new futures after shutdown"), the worker reported that to the
        coordinator, which released the lease, and the restarted actor trained the unit from step 0.
        Ray runs an actor's constructor in its process's main thread, the one that may set handlers."""
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)
        if previous is None:        # set outside Python: the default is what it would do
            previous = signal.SIG_DFL

        def on_sigterm(signum: int, frame: Any) -> None:
            log.warning("worker %d: SIGTERM: stopping as preempted (checkpoint stored, lease kept) "
                        "within %.0fs before the actor's process exits", self.index,
                        self.spec.grace_period_s)
            self.stop()
            if callable(previous):
                previous(signum, frame)     # Ray's: the process exits, Ray restarts the actor
                return
            signal.signal(signal.SIGTERM, previous)
            os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_sigterm)

    def _run(self) -> None:
        import asyncio

        self.state = "running"
        first = True

        def attempt() -> Any:
            nonlocal first
            if not first:
                with self._swap:    # a fresh Worker: the failed one's loop and session are gone
                    self.worker = self._new_worker()
                    if self._stopping.is_set():
                        self.worker.request_stop()
                self.state, self.error = "running", None
            first = False
            return asyncio.run(self.worker.run())

        def on_retry(exc: BaseException, tries: int, wait: float) -> None:
            log.warning("worker %d stopped on what a retry may cure (%s: %s); running it again in "
                        "%.0fs (try %d)", self.index, type(exc).__name__, exc, wait, tries + 1)
            self.state, self.error = "retrying", f"{type(exc).__name__}: {exc}"

        try:
            # a failure a retry may cure (its state's storage down at its start) runs the worker
            # again in this process: Ray restarts only dead processes, and this one lives on
            report = run_until_settled(attempt, self._stopping, on_retry=on_retry)
        except Exception as exc:  # reported through status()
            log.error("worker %d failed: %s: %s", self.index, type(exc).__name__, exc)
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            return
        finally:
            shutil.rmtree(self._cache, ignore_errors=True)   # its worker will not run again
        if report is None:      # stopped while it waited to run again: it holds nothing new
            self.state = "preempted"
            return
        self.report = dataclasses.asdict(report)
        self.state = report.reason

    def status(self) -> dict[str, Any]:
        return {"index": self.index, "node_id": self.node_id, "pid": os.getpid(), "restarted": self.restarted,
                "state": self.state, "report": self.report, "error": self.error,
                "state_url": self.spec.state_url(self.index), "spec": self.spec.to_dict(),
                "log": list(self.ring.lines)}

    def stop(self, timeout_s: float | None = None) -> dict[str, Any]:
        """The preemption notice: checkpoint, release the state, return the final status."""
        with self._swap:
            self._stopping.set()
            self.worker.request_stop()
        self.thread.join(timeout_s if timeout_s is not None else self.spec.grace_period_s + 10)
        return self.status()


class RayFleet:
    """The worker actors of one fleet (by their names in ``spec.namespace``); needs ``ray.init()``.

    Every call that talks to the actors is bounded: an actor Ray cannot place yet (no node has the
    resources it asks for) is reported as ``pending``, one that died (its constructor raised, say)
    as ``dead``, never waited on."""

    def __init__(self, spec: RayWorkerSpec, *, credentials: Mapping[str, str] | None = None) -> None:
        self.spec = spec
        #: Where the actors it starts get their join credential (``VCASYNC_JOIN_SECRET``,
        #: ``VCASYNC_JOIN_TOKEN``): ``credentials`` when given (``vcasync ray up`` passes what it
        #: read, from ``--join-secret-file`` too), else the driver's environment.
        self._credentials: Mapping[str, str] = os.environ if credentials is None else credentials
        self._ray = _ray()
        if not self._ray.is_initialized():
            raise ConfigError("call ray.init(address=...) before creating a RayFleet")
        #: The Ray actor id of each worker this fleet started or saw: one that leaves the namespace
        #: (a detached actor's name goes when it dies) is reported as dead, not forgotten.
        self._ids: dict[int, str] = {}

    @classmethod
    def attach(cls, namespace: str = "vcasync", timeout_s: float = 30.0) -> RayFleet:
        """The fleet already running in ``namespace``, with the spec it was started with."""
        ray = _ray()
        actors = _actors(ray, namespace)
        recorded = _recorded_actors(namespace)   # a dead actor's name is gone; the record keeps it
        if not actors and not recorded:
            raise ConfigError(f"no vcasync workers in the Ray namespace {namespace!r}; start some with "
                              "'vcasync ray up'")
        spec = _running_spec(ray, namespace, actors, timeout_s)
        if spec is None:
            raise ConfigError(f"cannot read the spec of the fleet in the Ray namespace {namespace!r}: no "
                              f"worker answered within {timeout_s:g}s; 'vcasync ray down' stops it anyway")
        fleet = cls(spec)
        fleet._ids.update(recorded)
        fleet._ids.update({i: _actor_id(a) for i, a in actors.items()})
        return fleet

    def scale(self, count: int) -> list[int]:
        """Run ``count`` workers: start the missing indices, stop (gracefully) and remove the highest
        ones beyond ``count``. Returns the indices now running. Refuses (:class:`ConfigError`) when
        the namespace already runs workers with another spec: mixing two would be silent damage."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError(f"the worker count must be a whole number >= 0, got {count!r}")
        ray, ns = self._ray, self.spec.namespace
        actors = _actors(ray, ns)
        if actors:
            self._check_same_spec(actors)
        cls = ray.remote(WorkerActor)
        started = [i for i in range(count) if i not in actors]
        if started:   # first: a driver that dies while starting them still leaves their spec
            _put_spec_record(ns, self.spec, {i: _actor_id(a) for i, a in actors.items()})
        for i in started:
            opts = actor_options(self.spec, i, self._credentials)
            actors[i] = cls.options(**opts).remote(self.spec.to_dict(), i)
            self._ids[i] = _actor_id(actors[i])
            log.info("started worker actor %d", i)
        extra = {i: actors.pop(i) for i in sorted(actors) if i >= count}
        _stop(ray, extra, self.spec.grace_period_s + 30)
        for i in set(self._ids) - set(actors):   # stopped, or dead and now replaced or scaled away
            self._ids.pop(i, None)
        if actors:
            # Every actor by its Ray id: one that dies loses its name, and 'status' still shows it dead.
            _put_spec_record(ns, self.spec, {i: self._ids[i] for i in actors})
        else:
            _delete_spec_record(ns)
        return sorted(actors)

    def _check_same_spec(self, actors: Mapping[int, Any]) -> None:
        ns = self.spec.namespace
        running = _running_spec(self._ray, ns, actors, 30.0)
        if running is None:
            raise ConfigError(f"the Ray namespace {ns!r} has workers {sorted(actors)} whose spec cannot be "
                              "read (none answered within 30s): 'vcasync ray down' first to replace them")
        diff = spec_differences(running.to_dict(), self.spec.to_dict())
        if diff:
            raise ConfigError(f"the Ray namespace {ns!r} already runs workers {sorted(actors)} with another "
                              f"spec ({'; '.join(diff)}): 'vcasync ray down' first to replace the fleet, or "
                              "'vcasync ray scale N' to resize it as it is")

    def placement_problem(self) -> str | None:
        """Why no node of the cluster could take a worker of this spec (a resource or label no alive
        node has), or None. Ray keeps such actors pending until a fitting node joins."""
        needs = {"CPU": self.spec.num_cpus, "GPU": self.spec.num_gpus}
        if self.spec.spot_resource:
            needs[self.spec.spot_resource] = _SPOT_SLIVER
        try:
            nodes = self._ray.nodes()
        except Exception as exc:  # the answer is advice; never fail a command over it
            log.debug("ray.nodes() failed: %s", exc)
            return None
        return placement_problem(needs, self.spec.spot_labels, nodes)

    def status(self, timeout_s: float = 30.0) -> dict[int, dict[str, Any]]:
        """Each worker's status, within ``timeout_s`` for the whole fleet: a live actor's own report;
        ``pending`` (not placed yet, ``error`` says why when no node could take it), ``unavailable``
        (Ray is restarting it, or it did not answer in time) or ``dead`` (``error``: what of)."""
        ray = self._ray
        actors = _actors(ray, self.spec.namespace)
        self._ids.update({i: _actor_id(a) for i, a in actors.items()})
        states = _gcs_states(ray, self._ids)
        out: dict[int, dict[str, Any]] = {}
        asks: dict[int, Any] = {}
        pending_why: str | None = None
        for i in sorted(set(self._ids) | set(actors)):
            state, reason = states.get(i, (None, None))
            if i not in actors or state == "DEAD":
                out[i] = {"index": i, "state": "dead", "error": reason or _GONE}
            elif state in ("PENDING_CREATION", "DEPENDENCIES_UNREADY"):
                if pending_why is None:
                    problem = self.placement_problem()
                    pending_why = f"cannot be placed: {problem}" if problem else _STARTING
                out[i] = {"index": i, "state": "pending", "error": pending_why}
            elif state == "RESTARTING":
                out[i] = {"index": i, "state": "unavailable", "error": "Ray is restarting the actor"}
            else:
                asks[i] = actors[i].status.remote()
        ready: list[Any] = []
        if asks:
            ready, _ = ray.wait(list(asks.values()), num_returns=len(asks), timeout=timeout_s)
        for i, ref in asks.items():
            if ref not in ready:
                out[i] = {"index": i, "state": "unavailable", "error": f"no answer within {timeout_s:g}s"}
                continue
            try:
                out[i] = ray.get(ref, timeout=0)
            except Exception as exc:
                out[i] = {"index": i, "state": "unavailable", "error": type(exc).__name__}
        return dict(sorted(out.items()))

    def wait_started(self, timeout_s: float = 60.0, poll_s: float = 0.5) -> dict[int, dict[str, Any]]:
        """Each worker's status once none is still being placed and constructed (within
        ``timeout_s``): then a trainer that does not import on the nodes shows as ``dead``, with the
        constructor's exception as ``error``. One Ray cannot place (``pending`` with the reason) is
        not waited for; neither is a running worker's training. An ``unavailable`` one is waited
        for: an actor dying in its constructor can answer its status call with an error, or not
        in time, before Ray's table says it is dead (until 2026-12-08 that ended the wait, and
        ``vcasync ray up`` said the fleet was running while the actor had died)."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.status(timeout_s=max(1.0, min(10.0, deadline - time.monotonic())))
            starting = [i for i, s in st.items() if s.get("state") == "unavailable" or (
                s.get("state"), s.get("error")) in (("pending", _STARTING), ("dead", _GONE))]
            # gone: maybe not listed yet, or died
            if not starting or time.monotonic() >= deadline:
                return st
            time.sleep(poll_s)

    def wait(self, timeout_s: float | None = None, poll_s: float = 2.0,
             on_change: Callable[[int, dict[str, Any]], None] | None = None) -> dict[int, dict[str, Any]]:
        """Block until every worker is done (finished, failed, stopped, or its actor dead); their final
        status. ``on_change(index, status)`` is called whenever a worker's state changes."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        seen: dict[int, tuple[Any, Any]] = {}
        while True:
            st = self.status()
            for i, s in st.items():
                key = (s.get("state"), s.get("error"))
                if seen.get(i) != key and on_change is not None:
                    on_change(i, s)
                seen[i] = key
            if fleet_done(st):
                return st
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"the fleet was not done after {timeout_s}s: "
                                   f"{ {i: s['state'] for i, s in st.items()} }")
            time.sleep(poll_s)

    def shutdown(self) -> None:
        """Stop every worker gracefully and remove the actors."""
        shutdown_fleet(self.spec.namespace, self.spec.grace_period_s + 30)
        self._ids.clear()


def shutdown_fleet(namespace: str, timeout_s: float | None = None) -> list[int]:
    """Stop every worker in ``namespace`` (gracefully where its actor is alive, within ``timeout_s``,
    by default its spec's grace period + 30 s) and remove the actors; needs no live actor, so it
    also clears a fleet that Ray could never place. Returns the indices it removed."""
    ray = _ray()
    actors = _actors(ray, namespace)
    dead = set(_recorded_actors(namespace)) - set(actors)   # died, their names gone: cleared too
    if timeout_s is None:
        spec = _spec_record(namespace)
        timeout_s = (spec.grace_period_s if spec is not None else 20.0) + 30
    _stop(ray, actors, timeout_s)
    _delete_spec_record(namespace)
    return sorted(set(actors) | dead)


_SPOT_SLIVER = 0.001
_GONE = "the actor is gone from the Ray namespace (it died, or something else removed it)"
_STARTING = "waiting for Ray to place and start it"
_KV_NAMESPACE = "vcasync"
_ACTORS_FIELD = "_actor_ids"


def _stop(ray: Any, actors: Mapping[int, Any], timeout_s: float) -> None:
    """Stop ``actors`` gracefully where alive (all within ``timeout_s``), then kill them for good."""
    if not actors:
        return
    states = _gcs_states(ray, {i: _actor_id(a) for i, a in actors.items()})
    stops = {i: a.stop.remote() for i, a in actors.items() if states.get(i, ("ALIVE", None))[0] == "ALIVE"}
    ready: list[Any] = []
    if stops:
        ready, _ = ray.wait(list(stops.values()), num_returns=len(stops), timeout=timeout_s)
    for i, ref in stops.items():
        try:
            if ref not in ready:
                raise TimeoutError(f"no answer within {timeout_s:g}s")
            ray.get(ref, timeout=0)
        except Exception as exc:  # a dead or wedged actor: kill it all the same
            log.warning("worker actor %d did not stop cleanly: %s", i, type(exc).__name__)
    for i, actor in sorted(actors.items(), reverse=True):
        try:
            ray.kill(actor, no_restart=True)
        except Exception as exc:  # already gone
            log.debug("killing worker actor %d: %s", i, exc)
        log.info("stopped worker actor %d", i)


def _actor_id(handle: Any) -> str:
    return str(handle._actor_id.hex())


def _gcs_states(ray: Any, ids: Mapping[int, str]) -> dict[int, tuple[str, str | None]]:
    """Ray's own view of each actor (``ALIVE``, ``PENDING_CREATION``, ``RESTARTING``, ``DEAD``...) and,
    for a dead one, why; from the GCS actor table, which keeps dead actors that lost their name. An
    actor Ray does not know (or a Ray without this table) is left out: the caller asks the actor."""
    try:
        from ray._private.state import actors as actor_table
    except ImportError:
        return {}
    out: dict[int, tuple[str, str | None]] = {}
    for i, actor_id in ids.items():
        try:
            info = actor_table(actor_id=actor_id)
        except Exception as exc:
            log.debug("actor table lookup of worker %d failed: %s", i, exc)
            continue
        if info:
            state = str(info.get("State"))
            out[i] = (state, death_reason(info.get("DeathCause")) if state == "DEAD" else None)
    return out


def _actors(ray: Any, namespace: str) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for i, name in _actor_names(ray, namespace).items():
        try:
            out[i] = ray.get_actor(name, namespace=namespace)
        except ValueError:  # it died between the listing and the lookup
            continue
    return out


def _running_spec(ray: Any, namespace: str, actors: Mapping[int, Any],
                  timeout_s: float) -> RayWorkerSpec | None:
    """The spec the fleet in ``namespace`` runs: the record ``scale`` keeps in Ray's key-value store,
    else (a fleet started before there was one) the first live worker's answer within ``timeout_s``."""
    spec = _spec_record(namespace)
    if spec is not None:
        return spec
    states = _gcs_states(ray, {i: _actor_id(a) for i, a in actors.items()})
    refs = [a.status.remote() for i, a in actors.items() if states.get(i, ("ALIVE", None))[0] == "ALIVE"]
    deadline = time.monotonic() + timeout_s
    while refs and (left := deadline - time.monotonic()) > 0:
        ready, refs = ray.wait(refs, num_returns=1, timeout=left)
        for ref in ready:
            try:
                return RayWorkerSpec.from_dict(ray.get(ref, timeout=0)["spec"])
            except Exception as exc:
                log.debug("reading the spec from a worker failed: %s", exc)
    return None


def _spec_key(namespace: str) -> str:
    return f"fleet-spec/{namespace}"


def _spec_record(namespace: str) -> RayWorkerSpec | None:
    try:
        from ray.experimental.internal_kv import _internal_kv_get
        raw = _internal_kv_get(_spec_key(namespace), namespace=_KV_NAMESPACE)
        return RayWorkerSpec.from_dict(json.loads(raw)) if raw else None
    except Exception as exc:  # no record store in this Ray, or a record we cannot read: ask the actors
        log.debug("reading the fleet's spec record failed: %s", exc)
        return None


def _recorded_actors(namespace: str) -> dict[int, str]:
    """The Ray actor id of each worker index the spec record lists (none for an older record)."""
    try:
        from ray.experimental.internal_kv import _internal_kv_get
        raw = _internal_kv_get(_spec_key(namespace), namespace=_KV_NAMESPACE)
        ids = json.loads(raw).get(_ACTORS_FIELD, {}) if raw else {}
        return {int(i): str(actor_id) for i, actor_id in ids.items()}
    except Exception as exc:  # no record store in this Ray, or a record we cannot read
        log.debug("reading the fleet's actor record failed: %s", exc)
        return {}


def _put_spec_record(namespace: str, spec: RayWorkerSpec, actor_ids: Mapping[int, str]) -> None:
    """The spec and the actor ids of its workers (``RayWorkerSpec.from_dict`` skips the latter)."""
    record = {**spec.to_dict(), _ACTORS_FIELD: {str(i): a for i, a in sorted(actor_ids.items())}}
    try:
        from ray.experimental.internal_kv import _internal_kv_put
        _internal_kv_put(_spec_key(namespace), json.dumps(record), True, namespace=_KV_NAMESPACE)
    except Exception as exc:
        log.debug("storing the fleet's spec record failed: %s", exc)


def _delete_spec_record(namespace: str) -> None:
    try:
        from ray.experimental.internal_kv import _internal_kv_del
        _internal_kv_del(_spec_key(namespace), namespace=_KV_NAMESPACE)
    except Exception as exc:
        log.debug("deleting the fleet's spec record failed: %s", exc)


def actor_options(spec: RayWorkerSpec, index: int, environ: Mapping[str, str]) -> dict[str, Any]:
    """The Ray actor options of worker ``index``: named and detached (a later driver finds it),
    restarted without limit (a preempted node is the normal case), on spot nodes only; the join
    credential from ``environ`` goes to its environment, never into the spec that status reports."""
    env = {**spec.env}
    for var in ("VCASYNC_JOIN_SECRET", "VCASYNC_JOIN_TOKEN"):
        if environ.get(var):
            env[var] = environ[var]
    opts: dict[str, Any] = {
        "name": f"{ACTOR_PREFIX}{index}", "namespace": spec.namespace, "lifetime": "detached",
        "max_restarts": -1, "max_task_retries": 0, "max_concurrency": 4,
        "num_cpus": spec.num_cpus, "num_gpus": spec.num_gpus, "runtime_env": {"env_vars": env}}
    if spec.spot_resource:
        opts["resources"] = {spec.spot_resource: _SPOT_SLIVER}
    if spec.spot_labels:
        opts["label_selector"] = dict(spec.spot_labels)
    return opts


def _actor_names(ray: Any, namespace: str) -> dict[int, str]:
    from ray.util import list_named_actors

    out: dict[int, str] = {}
    for entry in list_named_actors(all_namespaces=True):
        name, ns = entry["name"], entry["namespace"]
        if ns == namespace and name.startswith(ACTOR_PREFIX) and name[len(ACTOR_PREFIX):].isdigit():
            out[int(name[len(ACTOR_PREFIX):])] = name
    return out
