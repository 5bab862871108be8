"""The decisions of :mod:`vcasync.launch.ray` that need no Ray: whether a fleet is done, whether a
worker can be placed on any node, how two fleet specs differ, what a dead actor died of.

Kept apart so they are tested as plain functions, without starting a Ray cluster.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

__all__ = ["DONE", "FAILED", "RETRY_FIRST_S", "RETRY_MAX_S", "death_reason", "fleet_done",
           "placement_problem", "restartable", "run_until_settled", "spec_differences"]

T = TypeVar("T")

#: An actor's worker that failed on what a retry may cure runs again after this long, doubling up to
#: :data:`RETRY_MAX_S`: a storage outage of minutes costs a few idle minutes, not the worker.
RETRY_FIRST_S = 5.0
RETRY_MAX_S = 300.0

#: A worker in one of these states will not run again: ``wait`` ends once every worker is in one.
#: ``dead``: Ray's actor is gone for good (its constructor raised, it was killed, it left the namespace).
DONE = frozenset({"finished", "failed", "preempted", "max_units", "dead"})
#: The states that make ``vcasync ray up --wait`` exit with ERROR.
FAILED = frozenset({"failed", "dead"})


def fleet_done(states: Mapping[int, Mapping[str, Any]]) -> bool:
    """Whether every worker is done. An empty fleet is done: nothing is left to wait for (a fleet
    whose actors all died still lists them, as ``dead``, so this is not how a failure looks)."""
    return all(s.get("state") in DONE for s in states.values())


def restartable(exc: BaseException) -> bool:
    """Whether a worker that ended on ``exc`` should run again in its actor: a failure a retry may
    cure (:func:`vcasync.retry.is_transient`: its state's storage timing out or answering 5xx, a
    connection refused or reset), not one of its own making (a :class:`~vcasync.errors.ClosedError`:
    ``--give-up-after`` passed, :class:`~vcasync.errors.CoordinatorGoneError`, or it was closed), nor a
    configuration error, a trainer that fails, refused credentials or a missing bucket."""
    from ..errors import ClosedError
    from ..retry import is_transient

    return is_transient(exc) and not isinstance(exc, ClosedError)


def run_until_settled(attempt: Callable[[], T], stopping: threading.Event, *,
                      on_retry: Callable[[BaseException, int, float], None],
                      first_s: float = RETRY_FIRST_S, max_s: float = RETRY_MAX_S) -> T | None:
    """``attempt()`` until it returns (its value) or raises what :func:`restartable` says a retry
    cannot cure (raised). Between tries it waits ``first_s``, doubling up to ``max_s``, after
    calling ``on_retry(exc, tries so far, wait)``; None when ``stopping`` is set during a wait.
    Until 2026-12-07 an actor's worker whose state's storage was down for a minute at its start
    stayed ``failed`` for good: its process lived on, so Ray never restarted it."""
    tries = 0
    while True:
        try:
            return attempt()
        except Exception as exc:
            if not restartable(exc):
                raise
            tries += 1
            wait = min(max_s, first_s * 2.0 ** min(tries - 1, 30))
            on_retry(exc, tries, wait)
            if stopping.wait(wait):
                return None


def placement_problem(needs: Mapping[str, float], labels: Mapping[str, str],
                      nodes: Iterable[Mapping[str, Any]]) -> str | None:
    """Why no node of the cluster could ever take an actor that asks for the resources ``needs`` and
    the node ``labels``, or None when one could (it may still wait for that node to have room).
    ``nodes`` are ``ray.nodes()`` entries (``Alive``, ``Resources``, ``Labels``)."""
    alive = [n for n in nodes if n.get("Alive")]
    if not alive:
        return "no alive node in the cluster"
    wanted = {k: v for k, v in needs.items() if v > 0}
    for node in alive:
        total = node.get("Resources") or {}
        have = node.get("Labels") or {}
        if all(total.get(k, 0.0) >= v for k, v in wanted.items()) and all(
                have.get(k) == v for k, v in labels.items()):
            return None
    missing = sorted(k for k in wanted if not any((n.get("Resources") or {}).get(k, 0.0) > 0 for n in alive))
    if missing:
        return "needs resource " + ", ".join(repr(k) for k in missing) + ", which no alive node has"
    unlabelled = sorted(f"{k}={v}" for k, v in labels.items()
                        if not any((n.get("Labels") or {}).get(k) == v for n in alive))
    if unlabelled:
        return "needs node label " + ", ".join(unlabelled) + ", which no alive node carries"
    asked = ", ".join(f"{k} {v:g}" for k, v in sorted(wanted.items()))
    return f"needs {asked} on one node, and no alive node has that much"


def spec_differences(running: Mapping[str, Any], asked: Mapping[str, Any]) -> list[str]:
    """What differs between two fleet specs (``RayWorkerSpec.to_dict()``), one line per field;
    ``env`` by its keys only (its values may be endpoints a log should not carry)."""
    out = []
    for name in sorted(set(running) | set(asked)):
        old, new = running.get(name), asked.get(name)
        if old == new:
            continue
        if name == "env":
            old, new = sorted(old or {}), sorted(new or {})
            out.append(f"env: running with keys {old}, asked for keys {new} (or different values)")
        else:
            out.append(f"{name}: running {old!r}, asked {new!r}")
    return out


def death_reason(cause: Any) -> str:
    """One line out of Ray's ``ActorDeathCause`` (the GCS actor table's ``DeathCause``): the last line
    of the exception its constructor raised, or the message Ray gives for other deaths."""
    which = None
    try:
        which = cause.WhichOneof("context")
    except Exception:  # not the protobuf we know: say what we can
        return str(cause).strip().splitlines()[-1] if str(cause).strip() else "unknown cause"
    if which is None:
        return "unknown cause"
    ctx = getattr(cause, which)
    text = str(getattr(ctx, "formatted_exception_string", "") or getattr(ctx, "error_message", "") or "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # Ray's message for a constructor's exception is a traceback; its last line names the error.
    return f"{which.removesuffix('_context')}: {lines[-1] if lines else '(no message)'}"
